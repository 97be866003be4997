"""The Hermes tool-call format (verl's default; Qwen2.5's and Qwen3's chat templates):
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks inside an assistant turn."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CLOSE", "OPEN", "ParsedTurn", "ToolCall", "parse_hermes"]

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]  # the parsed JSON object
    raw: str = ""  # the text between <tool_call> and </tool_call>


@dataclass(frozen=True)
class ParsedTurn:
    content: str  # the assistant text with the tool-call blocks removed (stripped)
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)  # one reason per invalid block


def parse_hermes(text: str) -> ParsedTurn:
    """Split an assistant turn into its text and its tool calls. A block that is not a valid call
    (bad JSON, no "name", "arguments" not an object, no closing tag) gives one reason in `malformed`
    instead of a call; the block's text is removed from `content` either way."""
    content: list[str] = []
    calls: list[ToolCall] = []
    malformed: list[str] = []
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            malformed.append(f"unclosed {OPEN} (no {CLOSE} after it)")
            break
        raw = text[start + len(OPEN) : end]
        call = _parse_block(raw)
        if isinstance(call, ToolCall):
            calls.append(call)
        else:
            malformed.append(call)
        pos = end + len(CLOSE)
    return ParsedTurn(content="".join(content).strip(), calls=calls, malformed=malformed)


def _parse_block(raw: str) -> ToolCall | str:
    """A call, or the reason the block is not one."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return f"bad JSON ({e.msg} at char {e.pos})"
    if not isinstance(obj, dict):
        return f"not a JSON object (got {_json_type(obj)})"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return 'no "name" (a non-empty string naming the tool)'
    # a missing "arguments" is a call without arguments; some models emit the object as a JSON string
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return f'"arguments" of {name!r} is a string that is not JSON ({e.msg})'
    if not isinstance(arguments, dict):
        return f'"arguments" of {name!r} is not a JSON object (got {_json_type(arguments)})'
    return ToolCall(name=name.strip(), arguments=arguments, raw=raw)


def _json_type(value: Any) -> str:
    names = {
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)
