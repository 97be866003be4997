"""Trajectory: the token-space record of a conversation, its split rule and the token comparator."""

from __future__ import annotations

import pytest

from megarl.agentic.chat_format import ChatFormat
from megarl.agentic.trajectory import Trajectory
from tests.helpers.chat_families import family_tokenizer


def _hand_built() -> tuple[Trajectory, list[tuple[list[int], list[int]]]]:
    """prompt [1 2 3]; turn 0 generates [10 11 99]; tool tokens [50 51]; turn 1 generates [12 99]."""
    traj = Trajectory(prompt_ids=[1, 2, 3])
    calls = []
    calls.append((traj.context, [10, 11, 99]))
    traj.add_generated([10, 11, 99], log_probs=[-0.5, -0.25, -0.125])
    traj.add_given([50, 51])
    calls.append((traj.context, [12, 99]))
    traj.add_generated([12, 99])
    return traj, calls


def test_generated_and_given_tokens_are_recorded_with_mask_log_probs_and_turn_ends():
    traj, _ = _hand_built()
    assert traj.context == [1, 2, 3, 10, 11, 99, 50, 51, 12, 99]
    assert traj.ids == [10, 11, 99, 50, 51, 12, 99]
    assert traj.mask == [1, 1, 1, 0, 0, 1, 1]
    assert traj.log_probs == [-0.5, -0.25, -0.125, 0.0, 0.0, 0.0, 0.0]
    assert traj.turn_ends == [2, 6] and traj.turn_scores == [0.0, 0.0] and traj.num_turns == 2
    assert traj.generated_spans() == [(0, 3), (5, 7)]


def test_adjacent_turns_are_told_apart_and_an_empty_turn_adds_nothing():
    traj = Trajectory(prompt_ids=[1])
    traj.add_generated([5, 6])
    traj.add_generated([])
    traj.add_generated([7])
    assert traj.turn_ends == [1, 2] and traj.generated_spans() == [(0, 2), (2, 3)]
    assert traj.check_exact([([1], [5, 6]), ([1, 5, 6], [7])])
    assert not traj.check_exact([([1], [5, 6, 7])])  # one engine call is not two turns


def test_log_probs_must_match_the_generated_ids():
    with pytest.raises(
        ValueError, match="add_generated got 2 ids but 1 log-probs; give one per generated token"
    ):
        Trajectory(prompt_ids=[1]).add_generated([5, 6], log_probs=[-1.0])


def test_extend_or_split_appends_an_extension_as_given_tokens():
    traj, _ = _hand_built()
    assert traj.extend_or_split(traj.context) is None and len(traj.ids) == 7
    assert traj.extend_or_split(traj.context + [60, 61]) is None
    assert traj.ids[-2:] == [60, 61] and traj.mask[-2:] == [0, 0] and traj.log_probs[-2:] == [0.0, 0.0]


def test_extend_or_split_starts_a_new_trajectory_when_the_history_was_rewritten():
    traj, _ = _hand_built()
    before = (list(traj.ids), list(traj.mask))
    rewritten = [1, 2, 3, 11, 99, 50, 51, 12, 99, 60]  # turn 0's first token gone (e.g. stripped reasoning)
    split = traj.extend_or_split(rewritten)
    assert split is not None and split.prompt_ids == rewritten and split.ids == [] and split.mask == []
    assert (traj.ids, traj.mask) == before
    assert traj.extend_or_split(traj.context[:-1]) is not None  # shorter than the context: not an extension


def test_check_exact_accepts_the_engine_log_it_was_built_from():
    traj, calls = _hand_built()
    assert traj.first_mismatch(calls) is None and traj.check_exact(calls)
    # An engine call that generated nothing only has to agree on its input.
    assert traj.check_exact(calls[:1] + [(traj.context[:6], [])] + calls[1:])


def test_check_exact_catches_a_corrupted_given_token():
    traj, calls = _hand_built()
    traj.ids[3] = 52  # the tool output the engine read was 50
    assert not traj.check_exact(calls)
    assert traj.first_mismatch(calls) == (
        "engine call 1: its input+output (10 tokens) differs from the trajectory at position 6 "
        "(engine token 50, trajectory token 52; prompt is 3 tokens)"
    )


def test_check_exact_catches_a_corrupted_generated_token():
    traj, calls = _hand_built()
    traj.ids[5] = 13
    assert traj.first_mismatch(calls) == (
        "engine call 1: its input+output (10 tokens) differs from the trajectory at position 8 "
        "(engine token 12, trajectory token 13; prompt is 3 tokens)"
    )


def test_check_exact_catches_turns_and_calls_that_do_not_pair_up():
    traj, calls = _hand_built()
    assert traj.first_mismatch(calls[:1]) == "the trajectory has 2 generated turns but the engine generated 1"
    traj.mask[3] = 1  # a given token marked as generated
    assert traj.first_mismatch(calls) == "the mask marks 6 generated tokens but the turns cover 5"
    extra = Trajectory(prompt_ids=[1, 2, 3])
    extra.add_generated([10, 11, 99])
    extra.add_generated([50, 51])  # given tokens recorded as generated
    assert extra.first_mismatch([calls[0], (extra.context, [])]) == (
        "the trajectory has 2 generated turns but the engine generated 1"
    )
    shifted = Trajectory(prompt_ids=[1, 2, 3])
    shifted.add_given([10])
    shifted.add_generated([11, 99])
    assert shifted.first_mismatch([calls[0]]) == (
        "engine call 0: the engine generated 3 tokens at position 3, but the trajectory's turn 0 is "
        "2 generated tokens at position 4"
    )


def test_check_exact_catches_a_dropped_separator_at_the_assistant_to_tool_boundary():
    """A real ChatML boundary: the engine read "<|im_end|>" "\\n" "<|im_start|>user..."; a trajectory that
    re-derived the boundary without the "\\n" the template puts after <|im_end|> is caught."""
    tokenizer = family_tokenizer("qwen2_5")
    fmt = ChatFormat(tokenizer)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    prompt = fmt.prompt_ids([{"role": "user", "content": "2 + 2?"}])
    first, second = encode("Calling.") + [fmt.end_of_turn_id], encode("4") + [fmt.end_of_turn_id]
    boundary = fmt.append_ids([{"role": "tool", "content": "4"}], after_stop=fmt.end_of_turn_id)
    newline = encode("\n")
    assert boundary[: len(newline)] == newline
    calls = [(prompt, first), (prompt + first + boundary, second)]

    good = Trajectory(prompt_ids=prompt)
    good.add_generated(first)
    good.add_given(boundary)
    good.add_generated(second)
    assert good.check_exact(calls)

    dropped = Trajectory(prompt_ids=prompt)
    dropped.add_generated(first)
    dropped.add_given(boundary[len(newline) :])
    dropped.add_generated(second)
    assert not dropped.check_exact(calls)
    where = len(prompt) + len(first)
    assert dropped.first_mismatch(calls) == (
        f"engine call 1: its input+output ({len(calls[1][0]) + len(second)} tokens) differs from the trajectory "
        f"at position {where} (engine token {newline[0]}, trajectory token {boundary[len(newline)]}; prompt is "
        f"{len(prompt)} tokens)"
    )
