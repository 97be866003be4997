"""User tools of multi-turn rollouts: plain functions from a file (schema from the signature) and
verl's tool_config_path YAML classes, and the load errors config checks report before any process starts."""

from __future__ import annotations

import textwrap

import pytest

from megarl.agentic.tools import (
    ToolCall,
    ToolConfigError,
    ToolOutcome,
    ToolSet,
    check_tool_config,
    function_schema,
)

pytestmark = pytest.mark.unit


def test_function_tool_from_file_schema_and_call(tmp_path, monkeypatch):
    (tmp_path / "mytools.py").write_text(
        textwrap.dedent('''
        import asyncio
        from typing import Optional

        def lookup(city: str, days: int = 1, metric: Optional[bool] = None) -> str:
            """Weather for a city.

            More text the schema leaves out.
            """
            return f"{city}: sunny for {days} day(s)"

        async def slow_add(a: int, b: int) -> int:
            await asyncio.sleep(0.01)
            return a + b
    ''')
    )
    monkeypatch.chdir(tmp_path)
    toolset = ToolSet.from_config(["mytools.py:lookup", "mytools.py:slow_add", "calculator"])
    assert toolset.schemas[0] == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    assert toolset.call(ToolCall("lookup", {"city": "Oslo", "days": 2}), 5).text == "Oslo: sunny for 2 day(s)"
    assert toolset.call(ToolCall("slow_add", {"a": 2, "b": 3}), 5).text == "5"
    extra = toolset.call(ToolCall("lookup", {"city": "Oslo", "hours": 3}), 5)
    assert extra.outcome is ToolOutcome.MALFORMED and "has no argument(s) 'hours'" in extra.text
    assert function_schema(lambda x: x)["function"]["name"] == "<lambda>"


VERL_YAML = """
tools:
  - class_name: weather_tool.WeatherTool
    config: {type: native, unit: C}
    tool_schema:
      type: function
      function:
        name: get_weather
        description: Weather now.
        parameters: {type: object, properties: {city: {type: string}}, required: [city]}
  - class_name: {file}:EchoTool
    config: {}
    tool_schema: {type: function, function: {name: echo, description: Echo., parameters: {type: object, properties: {}}}}
"""

VERL_TOOL = """
class ToolResponse:
    def __init__(self, text=None):
        self.text = text

class WeatherTool:  # verl's BaseTool shape: async create/execute(instance_id, parameters)/release
    def __init__(self, config, tool_schema):
        self.unit, self.name, self.released = config["unit"], tool_schema.function.name, []

    async def create(self, instance_id=None, **kwargs):
        return "id-1", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=f"{parameters['city']}: 20 {self.unit} ({instance_id})"), 0.25, {"calls": 1}

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)

class EchoTool:
    def __init__(self, config, tool_schema):
        pass

    def execute(self, parameters):
        return "echo"
"""


def test_verl_yaml_classes_load_and_run(tmp_path, monkeypatch):
    (tmp_path / "weather_tool.py").write_text(VERL_TOOL)
    (tmp_path / "echo_tool.py").write_text(VERL_TOOL)
    config = tmp_path / "tools.yaml"
    config.write_text(VERL_YAML.replace("{file}", str(tmp_path / "echo_tool.py")))
    monkeypatch.syspath_prepend(str(tmp_path))
    toolset = ToolSet.from_config([], str(config))
    assert [s["function"]["name"] for s in toolset.schemas] == ["get_weather", "echo"]
    result = toolset.call(ToolCall("get_weather", {"city": "Oslo"}), 5)
    assert (result.text, result.outcome, result.reward, result.metrics) == (
        "Oslo: 20 C (id-1)",
        ToolOutcome.OK,
        0.25,
        {"calls": 1},
    )
    assert toolset.call(ToolCall("echo", {}), 5).text == "echo"


def test_load_errors_name_the_key_the_file_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("x = 1\ndef f(a: str) -> str:\n    return a\n")
    (tmp_path / "bad.yaml").write_text("tools: [\n")
    (tmp_path / "noname.yaml").write_text("tools:\n  - class_name: t.py:X\n    tool_schema: {function: {}}\n")
    problems = check_tool_config(
        ["calculator", "missing.py:f", "t.py:g", "t.py:x", "sqrt", "t.py:f", "t.py:f"]
    )
    assert problems == [
        f"rollout.multi_turn.tools[1]='missing.py:f': file {tmp_path}/missing.py not found; give the path from the directory megarl starts in, or an absolute one",
        "rollout.multi_turn.tools[2]='t.py:g': t.py has no 'g'; it defines x, f",
        "rollout.multi_turn.tools[3]='t.py:x': x is a int, not a function; name a function",
        "rollout.multi_turn.tools[4]='sqrt': not a built-in tool (calculator, python); name a function as path/to/file.py:function",
        "two tools are named 'f' (rollout.multi_turn.tools and rollout.multi_turn.tool_config_path together): "
        "names must be unique; drop one or rename it",
    ]
    assert check_tool_config([], None, 0, "top") == [
        "rollout.multi_turn.tool_response_truncate_side='top' is not one of left, right, middle (verl's meaning: "
        "left keeps the start of a long tool response, right its end, middle both halves)",
        "rollout.multi_turn.max_tool_response_length=0 must be ≥ 1 (characters of a tool response kept)",
    ]
    assert check_tool_config([], "bad.yaml")[0].startswith(
        "rollout.multi_turn.tool_config_path=bad.yaml: not valid YAML ("
    )
    assert check_tool_config([], "noname.yaml") == [
        "rollout.multi_turn.tool_config_path=noname.yaml: tools[0]: tool_schema needs function.name (OpenAI format: {type: function, function: {name, ...}})"
    ]
    assert check_tool_config([], "nofile.yaml") == [
        "rollout.multi_turn.tool_config_path=nofile.yaml: file not found; give the path from the directory megarl starts in, or an absolute one"
    ]
    with pytest.raises(
        ToolConfigError,
        match=r"invalid megarl config \(1 problem\):\n  - rollout.multi_turn.tools\[0\]='nope.py:f'",
    ):
        ToolSet.from_config(["nope.py:f"])
