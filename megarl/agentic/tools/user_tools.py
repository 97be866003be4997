"""Loading the tools a config names: the built-ins (`calculator`, `python`), plain functions
("file.py:function", schema from the signature and docstring) and verl's `tool_config_path` YAML
(`tools: [{class_name, config, tool_schema}]`, classes built as Cls(config, tool_schema) with an
`execute` method). Every load problem is one line naming the key, the file and the fix."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import os
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from megarl.agentic.tools import calculator as calc
from megarl.agentic.tools.registry import TRUNCATE_SIDES, Tool, ToolFailure, ToolOutcome
from megarl.agentic.tools.sandbox import SandboxLimits, run_python
from megarl.config.errors import ConfigError
from megarl.errors import MegarlError
from megarl.user_files import import_file

__all__ = ["BUILTIN_TOOLS", "ToolConfigError", "check_tool_config", "function_schema", "load_tools"]

TOOLS_KEY = "rollout.multi_turn.tools"
YAML_KEY = "rollout.multi_turn.tool_config_path"
SIDE_KEY = "rollout.multi_turn.tool_response_truncate_side"
LENGTH_KEY = "rollout.multi_turn.max_tool_response_length"
BUILTIN_TOOLS = ("calculator", "python")


class ToolConfigError(ConfigError):
    """A tool that cannot be loaded; raised before any process starts."""


def check_tool_config(
    tools: Sequence[str] = (),
    tool_config_path: str | None = None,
    max_tool_response_length: int = 256,
    truncate_side: str = "middle",
    **limits: int,
) -> list[str]:
    """One line per problem with the configured tools (empty when they all load); for config checks.
    Loading imports the users' files and builds their classes, as verl does at start-up."""
    return load_tools(tools, tool_config_path, max_tool_response_length, truncate_side, **limits)[1]


def load_tools(
    tools: Sequence[str] = (),
    tool_config_path: str | None = None,
    max_tool_response_length: int = 256,
    truncate_side: str = "middle",
    **limits: int,
) -> tuple[list[Tool], list[str]]:
    """(tools, problems). `limits` are SandboxLimits fields (cpu_s, memory_mb, file_mb, output_chars)."""
    loaded: list[Tool] = []
    problems: list[str] = []
    if truncate_side not in TRUNCATE_SIDES:
        problems.append(
            f"{SIDE_KEY}={truncate_side!r} is not one of {', '.join(TRUNCATE_SIDES)} (verl's meaning: left keeps "
            "the start of a long tool response, right its end, middle both halves)"
        )
    if max_tool_response_length < 1:
        problems.append(
            f"{LENGTH_KEY}={max_tool_response_length} must be ≥ 1 (characters of a tool response kept)"
        )
    for i, entry in enumerate(tools):
        where = f"{TOOLS_KEY}[{i}]={entry!r}"
        try:
            loaded.append(_load_entry(entry, limits))
        except _Problem as e:
            problems.append(f"{where}: {e}")
    if tool_config_path:
        from megarl.agentic.tools.verl_yaml import load_verl_yaml

        yaml_tools, yaml_problems = load_verl_yaml(tool_config_path)
        loaded += yaml_tools
        problems += yaml_problems
    seen: set[str] = set()
    for tool in loaded:
        if tool.name in seen:
            problems.append(
                f"two tools are named {tool.name!r} ({TOOLS_KEY} and {YAML_KEY} together): "
                "names must be unique; drop one or rename it"
            )
        seen.add(tool.name)
    return loaded, problems


class _Problem(MegarlError):
    """One load problem; the caller prefixes the key."""


def _builtin(name: str, limits: dict[str, int]) -> Tool:
    if name == "calculator":
        return Tool(calc.SCHEMA, lambda args, _timeout: calc.calculator(args["expression"]))
    sandbox = SandboxLimits(**limits)

    def python(args: dict[str, Any], timeout_s: float) -> str:
        code = args["code"]
        if not isinstance(code, str):
            raise ValueError(f'"code" must be a string, got {type(code).__name__}')
        result = run_python(code, timeout_s, sandbox)
        if result.status == "ok":
            return result.output or "(no output; print() the values you need)"
        why = {
            "timeout": (
                f"error: the code did not finish within {timeout_s:g} s and was stopped",
                ToolOutcome.TIMEOUT,
            ),
            "cpu_limit": (
                f"error: the code used more than {sandbox.cpu_s} s of CPU time",
                ToolOutcome.TIMEOUT,
            ),
            "output_limit": (f"error: the code wrote more than {sandbox.file_mb} MB", ToolOutcome.RAISED),
            "killed": (f"error: the code was killed (exit status {result.returncode})", ToolOutcome.RAISED),
        }
        text, outcome = why.get(result.status, ("", ToolOutcome.RAISED))
        raise ToolFailure((result.output + text).strip() or "error: the code failed", outcome)

    schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python script in a sandbox (no network, no files outside its directory) "
            "and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the script; print() the results"}},
                "required": ["code"],
            },
        },
    }
    return Tool(schema, python, times_itself=True)


def _load_entry(entry: str, limits: dict[str, int]) -> Tool:
    if not isinstance(entry, str) or not entry.strip():
        raise _Problem(f"name a built-in ({', '.join(BUILTIN_TOOLS)}) or a function as file.py:function")
    if entry in BUILTIN_TOOLS:
        try:
            return _builtin(entry, limits)
        except TypeError as e:
            raise _Problem(
                f"bad sandbox limits ({e}); use {', '.join(SandboxLimits.__dataclass_fields__)}"
            ) from None
    if ":" not in entry:
        raise _Problem(
            f"not a built-in tool ({', '.join(BUILTIN_TOOLS)}); name a function as path/to/file.py:function"
        )
    fn = _import_object(entry)
    if isinstance(fn, type) or not callable(fn):
        raise _Problem(f"{entry.rsplit(':', 1)[1]} is a {type(fn).__name__}, not a function; name a function")
    schema = function_schema(fn)
    return Tool(schema, lambda args, _timeout: _call_sync(fn, **args))


def _import_object(spec: str, base_dir: str | None = None) -> Any:
    """`path/to/file.py:Name`, `package.module:Name` or `package.module.Name`."""
    if ":" in spec:
        module_part, name = spec.rsplit(":", 1)
    else:
        module_part, _, name = spec.rpartition(".")
    if module_part.endswith(".py"):
        module = _load_file(module_part, base_dir)
    else:
        try:
            module = importlib.import_module(module_part)
        except Exception as e:
            fix = _import_fix(e, "install it, or give a file as path/to/file.py:Name")
            raise _Problem(f"cannot import {module_part!r}: {type(e).__name__}: {e}; {fix}") from None
    if not hasattr(module, name):
        public = [n for n in vars(module) if not n.startswith("_")]
        raise _Problem(
            f"{module_part} has no {name!r}; it defines {', '.join(public[:12]) or 'nothing public'}"
        )
    return getattr(module, name)


def _load_file(path: str, base_dir: str | None) -> types.ModuleType:
    candidates = [os.path.abspath(path)] + (
        [os.path.join(base_dir, path)] if base_dir and not os.path.isabs(path) else []
    )
    found = next((p for p in candidates if os.path.isfile(p)), None)
    if found is None:
        raise _Problem(
            f"file {candidates[0]} not found; give the path from the directory megarl starts in, or an absolute one"
        )
    try:
        module = import_file(os.path.realpath(found), "megarl_user_tools_", reuse=True)
    except Exception as e:
        fix = _import_fix(e, "fix that file")
        raise _Problem(f"importing {found} raised {type(e).__name__}: {e}; {fix}") from None
    assert module is not None, found
    return module


def _import_fix(error: Exception, default: str) -> str:
    if isinstance(error, ImportError) and (error.name or "").split(".")[0] == "verl":
        return (
            "megarl does not install verl: drop the BaseTool base class (megarl needs only __init__(config, "
            "tool_schema) and execute(instance_id, parameters) returning text or (text, reward, metrics))"
        )
    return default


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
                               tuple: "array", dict: "object"}  # fmt: skip


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        values = list(typing.get_args(hint))
        return {**_json_type(type(values[0])), "enum": values}
    kind = _JSON_TYPES.get(origin or hint)
    return {"type": kind} if kind else {}


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """An OpenAI function schema: parameters from the signature's type hints (a parameter without a
    default is required), the description from the docstring's first line."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    open_kwargs = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            open_kwargs = True
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            continue
        properties[p.name] = _json_type(hints.get(p.name, Any))
        if p.default is p.empty:
            required.append(p.name)
    doc = (inspect.getdoc(fn) or "").strip()
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if not open_kwargs:
        parameters["additionalProperties"] = False
    description = doc.splitlines()[0] if doc else fn.__name__
    return {
        "type": "function",
        "function": {"name": fn.__name__, "description": description, "parameters": parameters},
    }


def _call_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `fn`; a coroutine it returns runs to completion on a fresh event loop in this thread."""
    value = fn(*args, **kwargs)
    return asyncio.run(_settle(value)) if inspect.isawaitable(value) else value


async def _settle(value: Any) -> Any:
    return await value
