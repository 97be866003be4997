"""Stand-in for the tools part's Hermes parser: only the `ToolCall` record the endpoint returns.
The tools branch's hermes.py replaces this file at merge."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict  # parsed JSON object
    raw: str  # the text between <tool_call> and </tool_call>
