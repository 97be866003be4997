"""Tools for multi-turn rollouts: the Hermes tool-call parser, `ToolSet` (calls that never raise for
a tool's fault), the built-in `calculator` and sandboxed `python`, and user tools from config."""

from megarl.agentic.tools.hermes import ParsedTurn, ToolCall, parse_hermes
from megarl.agentic.tools.registry import (
    Tool,
    ToolFailure,
    ToolOutcome,
    ToolResult,
    ToolSet,
    count_outcomes,
    truncate,
)
from megarl.agentic.tools.user_tools import BUILTIN_TOOLS, ToolConfigError, check_tool_config, function_schema

__all__ = [
    "BUILTIN_TOOLS",
    "ParsedTurn",
    "Tool",
    "ToolCall",
    "ToolConfigError",
    "ToolFailure",
    "ToolOutcome",
    "ToolResult",
    "ToolSet",
    "check_tool_config",
    "count_outcomes",
    "function_schema",
    "parse_hermes",
    "truncate",
]
