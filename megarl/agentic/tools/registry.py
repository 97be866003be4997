"""`ToolSet`: the tools of a multi-turn rollout by name, with their OpenAI function schemas, and the
calls into them. A call never raises for a tool's fault: an unknown name, a missing argument, an
exception, a hang, a non-text answer or an over-long one each give a `ToolResult` whose text the
model reads and whose `outcome` the loop counts (`count_outcomes`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from megarl.agentic.tools.hermes import ToolCall
from megarl.errors import MegarlError

__all__ = [
    "TRUNCATE_SIDES",
    "Tool",
    "ToolFailure",
    "ToolOutcome",
    "ToolResult",
    "ToolSet",
    "count_outcomes",
    "truncate",
]

TRUNCATE_SIDES = ("left", "right", "middle")


class ToolOutcome(StrEnum):
    OK = "ok"
    RAISED = "raised"
    TIMEOUT = "timeout"
    NON_TEXT = "non_text"
    MALFORMED = "malformed"
    UNKNOWN = "unknown_tool"
    TRUNCATED = "truncated"


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model reads: the answer, cut as verl cuts it, or an error message
    outcome: ToolOutcome
    name: str
    reward: float | None = None  # a verl-style tool's step reward (its execute's second value)
    metrics: dict[str, Any] = field(default_factory=dict)  # a verl-style tool's own metrics


class ToolFailure(MegarlError):
    """Raised by a tool to answer with exactly `text` and count `outcome` (the sandbox's timeout)."""

    def __init__(self, text: str, outcome: ToolOutcome = ToolOutcome.RAISED) -> None:
        super().__init__(text)
        self.text = text
        self.outcome = outcome


@dataclass(frozen=True)
class Tool:
    """`run(arguments, timeout_s)` returns str, or (text, reward, metrics); ints and floats count as text."""

    schema: dict[str, Any]  # {"type": "function", "function": {name, description, parameters}}
    run: Callable[[dict[str, Any], float], Any]
    times_itself: bool = False  # stops itself at timeout_s (the sandbox): waited on a little longer

    @property
    def name(self) -> str:
        return str(self.schema["function"]["name"])


def truncate(text: str, limit: int, side: str = "middle") -> str:
    """verl's `tool_response_truncate_side` rule: "left" keeps the first `limit` characters, "right"
    the last, "middle" the first and last limit//2; the marker is added after cutting, as verl does."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + (text[-half:] if half else "")


class ToolSet:
    """Tools by name; `schemas` is what the chat template is given."""

    def __init__(
        self,
        tools: Sequence[Tool],
        max_tool_response_length: int = 256,
        truncate_side: str = "middle",
        timeout_s: float = 10.0,  # of a call that names none
    ) -> None:
        if truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"truncate_side={truncate_side!r}; use one of {', '.join(TRUNCATE_SIDES)}")
        self.tools = {t.name: t for t in tools}
        self.max_tool_response_length = max_tool_response_length
        self.truncate_side = truncate_side
        self.default_timeout_s = timeout_s

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    @classmethod
    def from_config(
        cls,
        tools: Sequence[str] = (),
        tool_config_path: str | None = None,
        max_tool_response_length: int = 256,
        truncate_side: str = "middle",
        timeout_s: float = 10.0,
        **sandbox_limits: int,
    ) -> ToolSet:
        """The tools named by `rollout.multi_turn.tools` (built-ins and "file.py:function") and the
        verl YAML at `tool_config_path`; raises ToolConfigError listing every problem."""
        from megarl.agentic.tools.user_tools import ToolConfigError, load_tools

        loaded, problems = load_tools(
            tools, tool_config_path, max_tool_response_length, truncate_side, **sandbox_limits
        )
        if problems:
            raise ToolConfigError(problems)
        return cls(loaded, max_tool_response_length, truncate_side, timeout_s)

    def malformed(self, reason: str, name: str = "") -> ToolResult:
        """The answer to a call the parser or the schema rejected."""
        example = '<tool_call>\n{"name": "<tool>", "arguments": {...}}\n</tool_call>'
        text = f"error: malformed tool call: {reason}. Write each call as {example}"
        return ToolResult(text=text, outcome=ToolOutcome.MALFORMED, name=name)

    def call(self, call: ToolCall, timeout_s: float | None = None) -> ToolResult:
        """Run one call; tool faults become results, never exceptions."""
        timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
        tool = self.tools.get(call.name)
        if tool is None:
            available = ", ".join(self.tools) or "none"
            return ToolResult(
                f"error: unknown tool {call.name!r}; available: {available}", ToolOutcome.UNKNOWN, call.name
            )
        problem = _check_arguments(tool.schema, call.arguments)
        if problem:
            return self.malformed(problem, call.name)
        wait_s = timeout_s + 5.0 if tool.times_itself else timeout_s
        done, value, error = _run_with_timeout(lambda: tool.run(call.arguments, timeout_s), wait_s)
        if not done:
            text = f"error: tool {call.name!r} did not answer within {timeout_s:g} s and was abandoned"
            return ToolResult(text, ToolOutcome.TIMEOUT, call.name)
        if isinstance(error, ToolFailure):
            return self._cut(error.text, call.name, error.outcome)
        if error is not None:
            message = f"error: {type(error).__name__}: {error}".rstrip(": ")
            return self._cut(message, call.name, ToolOutcome.RAISED)
        reward, metrics = None, {}
        if isinstance(value, tuple) and 1 <= len(value) <= 3:  # verl's (response, reward, metrics)
            value, reward, metrics = (*value, None, {})[:3]
            reward = float(reward) if isinstance(reward, int | float) else None
            metrics = metrics if isinstance(metrics, dict) else {}
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            text = (
                f"error: tool {call.name!r} returned {type(value).__name__}, not text; "
                "a tool must return a str (ints and floats are converted)"
            )
            return ToolResult(text, ToolOutcome.NON_TEXT, call.name, reward, metrics)
        result = self._cut(value, call.name, ToolOutcome.OK)
        return ToolResult(result.text, result.outcome, call.name, reward, metrics)

    def call_many(
        self, calls: Sequence[ToolCall], max_parallel: int = 1, timeout_s: float | None = None
    ) -> list[ToolResult]:
        """Run the calls of one turn, up to `max_parallel` at once; the results keep the calls' order."""
        if max_parallel <= 1 or len(calls) <= 1:
            return [self.call(c, timeout_s) for c in calls]
        with ThreadPoolExecutor(
            max_workers=min(max_parallel, len(calls)), thread_name_prefix="megarl-tool"
        ) as pool:
            return list(pool.map(lambda c: self.call(c, timeout_s), calls))

    def _cut(self, text: str, name: str, outcome: ToolOutcome) -> ToolResult:
        if len(text) <= self.max_tool_response_length:
            return ToolResult(text, outcome, name)
        cut = truncate(text, self.max_tool_response_length, self.truncate_side)
        return ToolResult(cut, ToolOutcome.TRUNCATED if outcome is ToolOutcome.OK else outcome, name)


def count_outcomes(results: Sequence[ToolResult]) -> dict[str, int]:
    """`agent/tool_calls` and `agent/tool_errors/<outcome>` for every non-ok outcome (zeros included,
    so per-batch sums have the same keys every step)."""
    counts = {"agent/tool_calls": len(results)}
    for outcome in ToolOutcome:
        if outcome is not ToolOutcome.OK:
            counts[f"agent/tool_errors/{outcome.value}"] = sum(r.outcome is outcome for r in results)
    return counts


def _check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str:
    """A missing required argument, or one the schema does not know when it forbids extras."""
    params = schema["function"].get("parameters") or {}
    props = params.get("properties") or {}
    name = schema["function"]["name"]
    missing = [p for p in params.get("required") or [] if p not in arguments]
    if missing:
        known = ", ".join(f"{k} ({v.get('type', 'any')})" for k, v in props.items()) or "none"
        return f"tool {name!r} needs argument(s) {', '.join(map(repr, missing))}; its parameters: {known}"
    extra = [a for a in arguments if a not in props]
    if extra and params.get("additionalProperties") is False:
        return f"tool {name!r} has no argument(s) {', '.join(map(repr, extra))}; its parameters: {', '.join(props)}"
    return ""


def _run_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any, BaseException | None]:
    """(finished, value, exception). A daemon thread per call: one that hangs is left behind (Python
    cannot stop a thread) without holding up the caller or the interpreter's exit."""
    box: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 — a tool's fault is reported to the model, not raised
            box["error"] = e
        finished.set()

    threading.Thread(target=target, name="megarl-tool-call", daemon=True).start()
    if not finished.wait(timeout_s):
        return False, None, None
    return True, box.get("value"), box.get("error")
