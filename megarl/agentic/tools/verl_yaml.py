"""verl's tool config (`actor_rollout_ref.rollout.multi_turn.tool_config_path`):
`tools: [{class_name, config, tool_schema}]`. A class is built as Cls(config=..., tool_schema=...)
like verl's BaseTool — the schema given as a dict that also reads like verl's pydantic schema
(`tool_schema.function.name`, `.model_dump()`) — and called through `execute(parameters)` or
verl's `execute(instance_id, parameters)` between `create()` and `release()`, sync or async."""

from __future__ import annotations

import inspect
import os
from typing import Any

import yaml

from megarl.agentic.tools.registry import Tool
from megarl.agentic.tools.user_tools import YAML_KEY, _call_sync, _import_object, _Problem, _settle

__all__ = ["SchemaView", "load_verl_yaml"]


class SchemaView(dict[str, Any]):
    """A schema dict whose keys also read as attributes, for tools written against verl's schema."""

    def __getattr__(self, key: str) -> Any:
        try:
            value = self[key]
        except KeyError:
            raise AttributeError(key) from None
        return SchemaView(value) if isinstance(value, dict) else value

    def model_dump(self, **_kwargs: Any) -> dict[str, Any]:
        return dict(self)


def load_verl_yaml(path: str) -> tuple[list[Tool], list[str]]:
    """(tools, problems) of one verl tool YAML."""
    where = f"{YAML_KEY}={path}"
    if not os.path.isfile(path):
        return [], [
            f"{where}: file not found; give the path from the directory megarl starts in, or an absolute one"
        ]
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except yaml.YAMLError as e:
        return [], [f"{where}: not valid YAML ({str(e).splitlines()[0]}); fix the file"]
    entries = doc.get("tools") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return [], [f"{where}: needs a top-level `tools:` list of {{class_name, config, tool_schema}}"]
    tools: list[Tool] = []
    problems: list[str] = []
    base_dir = os.path.dirname(os.path.abspath(path))
    for i, entry in enumerate(entries):
        try:
            tools.append(_load_class_tool(entry, base_dir))
        except _Problem as e:
            problems.append(f"{where}: tools[{i}]: {e}")
    return tools, problems


def _load_class_tool(entry: Any, base_dir: str) -> Tool:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise _Problem("needs class_name: a dotted import path or path/to/file.py:ClassName")
    class_name = entry["class_name"]
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise _Problem(f"config must be a mapping, got {type(config).__name__}")
    if config.get("type", "native") != "native":
        raise _Problem(f"config.type={config['type']!r}: only verl's native tools load in megarl (not MCP)")
    schema = entry.get("tool_schema")
    if schema is not None:
        schema = _checked_schema(schema)
    cls = _import_object(class_name, base_dir)
    if not isinstance(cls, type):
        raise _Problem(f"{class_name} is a {type(cls).__name__}, not a class")
    try:
        tool = cls(config=config, tool_schema=SchemaView(schema) if schema else None)
    except Exception as e:
        raise _Problem(f"{class_name}(config, tool_schema) raised {type(e).__name__}: {e}") from None
    if schema is None:
        found: Any = getattr(tool, "get_openai_tool_schema", lambda: None)()
        if hasattr(found, "model_dump"):
            found = found.model_dump()
        if found is None:
            raise _Problem(
                "has no tool_schema; add {type: function, function: {name, description, parameters}}"
            )
        schema = _checked_schema(found)
    if not callable(getattr(tool, "execute", None)):
        raise _Problem(f"{class_name} has no execute(parameters) method")
    return Tool(schema, lambda args, _timeout: _execute(tool, args))


def _checked_schema(schema: Any) -> dict[str, Any]:
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise _Problem(
            "tool_schema needs function.name (OpenAI format: {type: function, function: {name, ...}})"
        )
    return {"type": "function", **dict(schema), "function": dict(function)}


def _execute(tool: Any, arguments: dict[str, Any]) -> Any:
    """The text (or (text, reward, metrics)) of one call, through verl's instance protocol when
    `execute` takes an instance id first."""
    params = inspect.signature(tool.execute).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        return _as_text(_call_sync(tool.execute, arguments))
    return _as_text(_call_sync(_verl_protocol, tool, arguments))


async def _verl_protocol(tool: Any, arguments: dict[str, Any]) -> Any:
    instance_id = None
    if hasattr(tool, "create"):
        created = await _settle_maybe(tool.create())
        instance_id = created[0] if isinstance(created, tuple) else created
    try:
        return await _settle_maybe(tool.execute(instance_id, arguments))
    finally:
        if hasattr(tool, "release"):
            await _settle_maybe(tool.release(instance_id))


async def _settle_maybe(value: Any) -> Any:
    return await _settle(value) if inspect.isawaitable(value) else value


def _as_text(value: Any) -> Any:
    """verl's ToolResponse (anything with `.text`) as its text; tuples keep reward and metrics."""
    if isinstance(value, tuple) and value:
        return (_as_text(value[0]), *value[1:])
    if not isinstance(value, str) and hasattr(value, "text"):
        return value.text if value.text is not None else ""
    return value
