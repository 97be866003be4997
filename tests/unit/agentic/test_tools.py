"""Tools of multi-turn rollouts: the Hermes parser, each ToolSet outcome with the message the model
reads, verl's truncation sides, parallel calls and the calculator's exactness and bounds."""

from __future__ import annotations

import json
import threading
import time

import pytest

from megarl.agentic.tools import (
    Tool,
    ToolCall,
    ToolOutcome,
    ToolSet,
    count_outcomes,
    parse_hermes,
    truncate,
)
from megarl.agentic.tools.calculator import calculate, calculator

pytestmark = pytest.mark.unit


def block(obj) -> str:
    return f"<tool_call>\n{obj if isinstance(obj, str) else json.dumps(obj)}\n</tool_call>"


def test_hermes_parses_calls_in_order_and_strips_them_from_content():
    text = "Let me compute.\n" + block({"name": "calculator", "arguments": {"expression": "1+2"}}) + "\n"
    text += block({"name": "python", "arguments": json.dumps({"code": "print(3)"})}) + "\nDone."
    turn = parse_hermes(text)
    assert turn.content == "Let me compute.\n\n\nDone."
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("calculator", {"expression": "1+2"}),
        ("python", {"code": "print(3)"}),  # arguments given as a JSON string
    ]
    assert turn.calls[0].raw.strip() == json.dumps({"name": "calculator", "arguments": {"expression": "1+2"}})
    assert turn.malformed == []
    assert parse_hermes("  no calls here ") == parse_hermes("no calls here")
    assert parse_hermes("no calls here").calls == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"name": "calculator", "arguments": {"expression": "1+2"}', "bad JSON"),
        ('["calculator"]', "not a JSON object (got array)"),
        ('{"arguments": {}}', 'no "name"'),
        ('{"name": "", "arguments": {}}', 'no "name"'),
        (
            '{"name": "calculator", "arguments": [1, 2]}',
            "\"arguments\" of 'calculator' is not a JSON object (got array)",
        ),
        ('{"name": "calculator", "arguments": "{oops"}', "is a string that is not JSON"),
        ('{"name": "calculator", "arguments": "[1]"}', "is not a JSON object (got array)"),
    ],
)
def test_hermes_malformed_block_gives_a_reason_and_no_call(body, reason):
    turn = parse_hermes("before " + block(body) + " after " + block({"name": "ok", "arguments": {}}))
    assert len(turn.malformed) == 1 and reason in turn.malformed[0]
    assert [c.name for c in turn.calls] == ["ok"]
    assert turn.content == "before  after"


def test_hermes_unclosed_block_is_malformed_and_dropped_from_content():
    turn = parse_hermes('Answer: <tool_call>\n{"name": "calculator", "arguments": {}}')
    assert turn.malformed == ["unclosed <tool_call> (no </tool_call> after it)"]
    assert turn.calls == [] and turn.content == "Answer:"


def _sleep_forever(args, timeout):
    time.sleep(60)


def _faulty_tools() -> ToolSet:
    def tool(name, run, required=()):
        params = {
            "type": "object",
            "properties": {p: {"type": "string"} for p in required},
            "required": list(required),
        }
        return Tool({"type": "function", "function": {"name": name, "parameters": params}}, run)

    def boom(args, timeout):
        raise KeyError("no such row")

    return ToolSet(
        [
            tool("echo", lambda args, t: args["text"], required=("text",)),
            tool("boom", boom),
            tool("hang", _sleep_forever),
            tool("as_dict", lambda args, t: {"a": 1}),
            tool("as_none", lambda args, t: None),
            tool("as_int", lambda args, t: 42),
            tool("verl_style", lambda args, t: ("fine", 0.5, {"hits": 1})),
        ],
        max_tool_response_length=10,
        truncate_side="left",
    )


@pytest.mark.parametrize(
    ("call", "outcome", "text"),
    [
        (ToolCall("echo", {"text": "hi"}), ToolOutcome.OK, "hi"),
        (ToolCall("as_int", {}), ToolOutcome.OK, "42"),
        (ToolCall("echo", {"text": "0123456789abc"}), ToolOutcome.TRUNCATED, "0123456789...(truncated)"),
        (
            ToolCall("nope", {}),
            ToolOutcome.UNKNOWN,
            "error: unknown tool 'nope'; available: echo, boom, hang, as_dict, as_none, as_int, verl_style",
        ),
        (ToolCall("boom", {}), ToolOutcome.RAISED, "error: KeyError: 'no such row'"),
        (
            ToolCall("as_dict", {}),
            ToolOutcome.NON_TEXT,
            "error: tool 'as_dict' returned dict, not text; a tool must return a str (ints and floats are converted)",
        ),
        (
            ToolCall("as_none", {}),
            ToolOutcome.NON_TEXT,
            "error: tool 'as_none' returned NoneType, not text; a tool must return a str (ints and floats are converted)",
        ),
        (
            ToolCall("echo", {}),
            ToolOutcome.MALFORMED,
            'error: malformed tool call: tool \'echo\' needs argument(s) \'text\'; its parameters: text (string). Write each call as <tool_call>\n{"name": "<tool>", "arguments": {...}}\n</tool_call>',
        ),
    ],
)
def test_toolset_outcome_and_message(call, outcome, text):
    toolset = _faulty_tools()
    toolset.max_tool_response_length = 1000 if outcome not in (ToolOutcome.TRUNCATED,) else 10
    result = toolset.call(call, timeout_s=5)
    assert (result.outcome, result.text, result.name) == (outcome, text, call.name)


def test_hung_tool_times_out_without_hanging_the_caller():
    start = time.monotonic()
    result = _faulty_tools().call(ToolCall("hang", {}), timeout_s=0.5)
    assert time.monotonic() - start < 1.5
    assert result.outcome is ToolOutcome.TIMEOUT
    assert result.text == "error: tool 'hang' did not answer within 0.5 s and was abandoned"


def test_verl_style_tuple_keeps_reward_and_metrics():
    result = _faulty_tools().call(ToolCall("verl_style", {}), timeout_s=5)
    assert (result.text, result.outcome, result.reward, result.metrics) == (
        "fine",
        ToolOutcome.OK,
        0.5,
        {"hits": 1},
    )


def test_malformed_parse_reason_reads_as_a_malformed_result():
    reason = parse_hermes("<tool_call>\n{bad}\n</tool_call>").malformed[0]
    result = _faulty_tools().malformed(reason)
    assert result.outcome is ToolOutcome.MALFORMED and result.text.startswith(
        "error: malformed tool call: bad JSON"
    )


@pytest.mark.parametrize(
    ("side", "expected"),
    [("left", "abcd...(truncated)"), ("right", "(truncated)...wxyz"), ("middle", "ab...(truncated)...yz")],
)
def test_truncation_sides_follow_verl(side, expected):
    # verl's tool_agent_loop keeps max_tool_response_length characters, then adds its marker
    text = "abcdefghijklmnopqrstuvwxyz"
    assert truncate(text, 4, side) == expected
    assert truncate(text, 26, side) == text
    toolset = ToolSet([Tool(_schema("t"), lambda a, t: text)], max_tool_response_length=4, truncate_side=side)
    result = toolset.call(ToolCall("t", {}), timeout_s=5)
    assert (result.text, result.outcome) == (expected, ToolOutcome.TRUNCATED)


def _schema(name):
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
    }


def test_call_many_runs_in_parallel_and_keeps_order():
    barrier = threading.Barrier(3, timeout=5)  # passes only when three calls run at once

    def wait_then_echo(args, timeout):
        barrier.wait()
        return args["i"]

    toolset = ToolSet([Tool(_schema("w"), wait_then_echo)])
    results = toolset.call_many([ToolCall("w", {"i": str(i)}) for i in range(3)], max_parallel=3, timeout_s=5)
    assert [r.text for r in results] == ["0", "1", "2"]
    assert count_outcomes(results + [toolset.malformed("x")]) == {
        "agent/tool_calls": 4,
        "agent/tool_errors/raised": 0,
        "agent/tool_errors/timeout": 0,
        "agent/tool_errors/non_text": 0,
        "agent/tool_errors/malformed": 1,
        "agent/tool_errors/unknown_tool": 0,
        "agent/tool_errors/truncated": 0,
    }


@pytest.mark.parametrize(
    "expr", ["123456789 * 987654321 + 42", "2**200 - 3**100", "(-7) // 2", "-7 % 3", "10**50 // 7", "6 / 3"]
)
def test_calculator_is_exact_like_python_ints(expr):
    expected = eval(expr.replace("/ 3", "// 3"))  # the reference: Python's own integer arithmetic
    assert calculator(expr) == str(expected)


def test_calculator_floats_and_errors():
    assert calculator("7 / 2") == "3.5" and calculator("0.1 + 0.2") == repr(0.1 + 0.2)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"9\*\*387420489 has about 3.7e\+08 digits; the limit is 4000"):
        calculate("9**9**9")
    assert time.monotonic() - start < 0.1
    with pytest.raises(ZeroDivisionError):
        calculate("1 // 0")
    with pytest.raises(ValueError, match=r"`__import__\('os'\)` is not allowed"):
        calculate("__import__('os')")
    result = ToolSet.from_config(["calculator"]).call(ToolCall("calculator", {"expression": "2**10**5"}), 5)
    assert result.outcome is ToolOutcome.RAISED
    assert result.text == "error: ValueError: 2**100000 has about 3.01e+04 digits; the limit is 4000"
