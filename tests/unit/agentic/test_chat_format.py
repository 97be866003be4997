"""ChatFormat: the tokens appended between generated turns equal what each family's template renders."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from megarl.agentic.chat_format import ChatFormat, ChatFormatError
from megarl.agentic.trajectory import Trajectory
from megarl.models.tiny import build_tokenizer
from tests.helpers.chat_families import FAMILIES, STOP_TOKENS, family_tokenizer, stop_token_ids

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Exact integer arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
PROMPT = [
    {"role": "system", "content": "Use the calculator for long numbers."},
    {"role": "user", "content": "What is 123456 * 654321?"},
]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123456 * 654321"}}\n</tool_call>'
ANSWER = "The product is 80779853376."


def tool(text: str) -> dict:
    return {"role": "tool", "content": text}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


# Conversations after PROMPT: an assistant text, then the messages appended after it, turn by turn.
SCENARIOS = {
    "one_tool": [(CALL, [tool('{"result": 80779853376}')]), (ANSWER, [user("Next.")])],
    "tools_at_once": [
        (CALL + "\n" + CALL, [tool("80779853376"), tool("80779853376")]),
        (ANSWER, [user("Next.")]),
    ],
    "three_tool_turns": [(CALL, [tool("1")]), (CALL, [tool("2"), tool("3")]), (CALL, [tool("4")])],
    "user_turns": [("Do you want the digits?", [user("Yes, all of them.")]), (ANSWER, [user("Thanks!")])],
    # Contents a template may rewrite (Llama 3.1 trims user turns and quotes tool output through tojson).
    "awkward_contents": [
        (CALL, [tool(' {"a": "b\\\\c"}\n '), tool("")]),
        (ANSWER, [user("  spaced \n"), user("ünï ✓")]),
    ],
    "tool_then_user": [
        (CALL, [tool("80779853376")]),
        (ANSWER, [user("Now add 1.")]),
        ("80779853377", [tool("ok")]),
    ],
}


def _render_ids(tokenizer, messages: list[dict], tools=TOOLS, **kwargs) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
    )
    return tokenizer.encode(text, add_special_tokens=False)


def _roll_out(fmt: ChatFormat, turns, stop: int) -> tuple[Trajectory, list[dict]]:
    """A token-space rollout of `turns` (each assistant text generated with `stop`) and its messages."""
    messages = list(PROMPT)
    traj = Trajectory(prompt_ids=fmt.prompt_ids(messages))
    for text, following in turns:
        traj.add_generated(fmt.tokenizer.encode(text, add_special_tokens=False) + [stop])
        messages.append({"role": "assistant", "content": text})
        if following:
            traj.add_given(fmt.append_ids(following, after_stop=stop))
            messages.extend(following)
    return traj, messages


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("family", FAMILIES)
def test_appended_tokens_equal_the_templates_own_render(family, scenario):
    """prompt + generated (text + end-of-turn) + appended ids, turn after turn, are exactly the ids of the
    template's render of the whole conversation with its generation prompt."""
    tokenizer = family_tokenizer(family)
    fmt = ChatFormat(tokenizer, tools=TOOLS)
    traj, messages = _roll_out(fmt, SCENARIOS[scenario], stop=fmt.end_of_turn_id)
    assert traj.context == _render_ids(tokenizer, messages)
    generated = [
        tokenizer.encode(text, add_special_tokens=False) + [fmt.end_of_turn_id]
        for text, _ in SCENARIOS[scenario]
    ]
    assert [traj.ids[a:b] for a, b in traj.generated_spans()] == generated


@pytest.mark.parametrize("family", FAMILIES)
def test_turn_cut_by_length_or_stopped_at_another_eos_gets_the_end_of_turn_token(family):
    tokenizer = family_tokenizer(family)
    fmt = ChatFormat(tokenizer, tools=TOOLS)
    other_eos = stop_token_ids(tokenizer, family)[1]
    follow = [tool("42")]
    expected = _render_ids(tokenizer, PROMPT + [{"role": "assistant", "content": CALL}] + follow)
    generated = tokenizer.encode(CALL, add_special_tokens=False)
    prompt = fmt.prompt_ids(PROMPT)
    cut = fmt.append_ids(follow, after_stop=None)
    assert cut[0] == fmt.end_of_turn_id
    assert prompt + generated + cut == expected
    assert fmt.append_ids(follow, after_stop=other_eos) == cut
    assert fmt.append_ids(follow, after_stop=fmt.end_of_turn_id) == cut[1:]


EXPECTED_BOUNDARIES = {
    # family: (end-of-turn token, its rest after a turn, the generation prompt)
    "llama3": ("<|eot_id|>", "", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "qwen2_5": ("<|im_end|>", "\n", "<|im_start|>assistant\n"),
    "qwen3": ("<|im_end|>", "\n", "<|im_start|>assistant\n"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_end_of_turn_and_generation_prompt_are_read_off_the_template(family):
    tokenizer = family_tokenizer(family)
    fmt = ChatFormat(tokenizer)
    end, rest, header = EXPECTED_BOUNDARIES[family]
    assert fmt.end_of_turn_id == tokenizer.convert_tokens_to_ids(end) == stop_token_ids(tokenizer, family)[0]
    assert fmt.stop_token_ids == [fmt.end_of_turn_id]  # each family's eos_token is its end-of-turn token
    assert fmt.turn_close == end + rest
    assert fmt.generation_prompt == header
    assert fmt.family == {"llama3": "llama3", "qwen2_5": "chatml", "qwen3": "qwen3"}[family]
    tool_text = tokenizer.decode(fmt.append_ids([tool("7")], after_stop=fmt.end_of_turn_id))
    user_text = tokenizer.decode(fmt.append_ids([user("7")], after_stop=fmt.end_of_turn_id))
    assert (
        tool_text
        == {
            "llama3": '<|start_header_id|>ipython<|end_header_id|>\n\n"7"<|eot_id|>' + header,
            "qwen2_5": "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n" + header,
            "qwen3": "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n" + header,
        }[family]
    )
    assert (
        user_text
        == {
            "llama3": "<|start_header_id|>user<|end_header_id|>\n\n7<|eot_id|>" + header,
            "qwen2_5": "\n<|im_start|>user\n7<|im_end|>\n" + header,
            "qwen3": "\n<|im_start|>user\n7<|im_end|>\n" + header,
        }[family]
    )


def test_tools_go_into_the_first_render_only():
    tokenizer = family_tokenizer("qwen2_5")
    with_tools, plain = ChatFormat(tokenizer, tools=TOOLS), ChatFormat(tokenizer)
    text = tokenizer.decode(with_tools.prompt_ids(PROMPT))
    system_turn = text.split("<|im_end|>")[0]
    assert '"name": "calculator"' in system_turn and "<tools>" in system_turn
    assert "<tools>" not in tokenizer.decode(plain.prompt_ids(PROMPT))
    assert with_tools.append_ids([tool("1")], 4) == plain.append_ids([tool("1")], 4)


THINKING_TURNS = [
    ("<think>\nI need the calculator.\n</think>\n\n" + CALL, [tool("80779853376")]),
    ("<think>\nIt answered; check it once more.\n</think>\n\n" + CALL, [tool("80779853376")]),
    ("<think>\nBoth agree.\n</think>\n\n" + ANSWER, [tool("done")]),
]


def test_qwen3_keeps_reasoning_across_tool_turns_so_the_render_extends():
    tokenizer = family_tokenizer("qwen3")
    fmt = ChatFormat(tokenizer, tools=TOOLS)
    traj, messages = _roll_out(fmt, THINKING_TURNS, stop=fmt.end_of_turn_id)
    assert traj.context == _render_ids(tokenizer, messages)


def test_qwen3_rerender_after_a_user_message_is_not_an_extension_and_splits():
    """A new user query makes Qwen3's template drop the earlier turns' <think> blocks: the re-rendered
    conversation is not an extension of the token-space context, so extend_or_split starts a new sample."""
    tokenizer = family_tokenizer("qwen3")
    fmt = ChatFormat(tokenizer, tools=TOOLS)
    traj, messages = _roll_out(fmt, THINKING_TURNS, stop=fmt.end_of_turn_id)
    rerender = _render_ids(tokenizer, messages + [user("And times 2?")])
    assert rerender[: len(traj.context)] != traj.context
    assert "I need the calculator" not in tokenizer.decode(rerender)
    assert "I need the calculator" in tokenizer.decode(traj.context)
    kept = list(traj.ids)
    split = traj.extend_or_split(rerender)
    assert split is not None and split.prompt_ids == rerender and split.ids == []
    assert traj.ids == kept
    # The token-space path appends instead: the reasoning the model saw stays in its context.
    appended = fmt.append_ids([user("And times 2?")], after_stop=fmt.end_of_turn_id)
    assert tokenizer.decode(appended) == "\n<|im_start|>user\nAnd times 2?<|im_end|>\n<|im_start|>assistant\n"
    assert traj.extend_or_split(traj.context + appended) is None
    assert traj.ids == kept + appended and traj.mask[len(kept) :] == [0] * len(appended)


def test_qwen3_enable_thinking_false_opens_every_turn_with_an_empty_think_block():
    tokenizer = family_tokenizer("qwen3")
    fmt = ChatFormat(tokenizer, chat_template_kwargs={"enable_thinking": False})
    empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert fmt.generation_prompt == empty_think
    assert tokenizer.decode(fmt.prompt_ids(PROMPT)).endswith(empty_think)
    appended = tokenizer.decode(fmt.append_ids([tool("1")], after_stop=fmt.end_of_turn_id))
    assert appended.endswith("</tool_response><|im_end|>\n" + empty_think)
    # The template's re-render drops the empty block of the earlier turn: only token space keeps it.
    traj, messages = _roll_out(fmt, [(CALL, [tool("1")])], stop=fmt.end_of_turn_id)
    rerender = _render_ids(tokenizer, messages, tools=None, enable_thinking=False)
    assert tokenizer.decode(rerender).count("<think>") == 1  # only the new generation prompt's
    assert traj.context != rerender and traj.extend_or_split(rerender) is not None


def test_a_template_whose_turn_ends_at_another_token_than_eos_stops_on_both():
    tokenizer = build_tokenizer(1001)  # ChatML template, eos <|eos|>
    fmt = ChatFormat(tokenizer)
    im_end, eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|eos|>"])
    assert fmt.stop_token_ids == [im_end, eos] and fmt.family == "chatml"
    assert fmt.append_ids([user("x")], after_stop=eos)[:2] == tokenizer.encode(
        "<|im_end|>\n", add_special_tokens=False
    )


def test_assistant_or_no_messages_are_refused_with_the_fix():
    fmt = ChatFormat(family_tokenizer("qwen2_5"))
    with pytest.raises(
        ChatFormatError, match="message 1 has role 'assistant'; assistant turns are generated"
    ):
        fmt.append_ids([tool("1"), {"role": "assistant", "content": "x"}], after_stop=None)
    with pytest.raises(ChatFormatError, match="at least one message"):
        fmt.append_ids([], after_stop=None)


def test_a_tokenizer_without_chat_template_is_refused():
    tokenizer = build_tokenizer(1001)
    tokenizer.chat_template = None
    with pytest.raises(ChatFormatError, match="has no chat template"):
        ChatFormat(tokenizer)


def test_a_template_error_names_the_roles():
    tokenizer = family_tokenizer("llama3")
    fmt = ChatFormat(tokenizer, tools=TOOLS)
    with pytest.raises(ChatFormatError, match=r"fails on messages with roles \['system'\]"):
        fmt.prompt_ids([{"role": "system", "content": "only a system turn"}])


@pytest.mark.parametrize("family", FAMILIES)
def test_family_tokenizers_fit_the_tiny_vocab_and_reload(family, tmp_path):
    tokenizer = family_tokenizer(family, out_dir=tmp_path)
    assert max(tokenizer.get_vocab().values()) < 1001
    assert len(set(stop_token_ids(tokenizer, family))) == len(STOP_TOKENS[family])
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    messages = PROMPT + [{"role": "assistant", "content": CALL}, tool("1")]
    assert _render_ids(loaded, messages) == _render_ids(tokenizer, messages)
    assert ChatFormat(loaded, tools=TOOLS).append_ids([tool("1")], None) == ChatFormat(
        tokenizer, tools=TOOLS
    ).append_ids([tool("1")], None)
