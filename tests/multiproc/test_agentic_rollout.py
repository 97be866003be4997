"""Multi-turn rollouts in token space on a real vLLM engine (tests/multiproc/agentic_checks.py, one rank in
the shared 1-rank launch): the token comparator for the chat templates of Llama 3, Qwen2.5 and Qwen3, and
a harness whose rewritten history splits the conversation instead of corrupting it."""

from __future__ import annotations

import pytest

from tests.multiproc.agentic_checks import TURNS
from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

FAMILIES = ("llama3", "qwen2_5", "qwen3")


def _argv(request) -> list:
    return [
        request.getfixturevalue("tiny_models")["qwen2"],
        request.getfixturevalue("tmp_path_factory").mktemp("fam"),
    ]


SHARED_PART_1 = ("agentic", "tests.multiproc.agentic_checks", _argv)


@pytest.fixture(scope="module")
def agentic(shared_launch_1):
    return shared_result(shared_launch_1, "agentic")


@pytest.mark.parametrize("family", FAMILIES)
def test_trained_tokens_are_the_engines_tokens(agentic, family):
    res = agentic["families"][family]
    assert res["engine_mismatches"] == []
    assert res["token_exact"] == [1] * len(res["token_exact"])  # the rollout's own comparator agrees
    assert res["split_index"] == [0] * len(res["split_index"])


@pytest.mark.parametrize("family", FAMILIES)
def test_every_turn_boundary_is_the_templates(agentic, family):
    res = agentic["families"][family]
    assert res["template_mismatches"] == []
    assert res["given_tokens"] > 0  # user turns and boundaries were appended, with no loss on them


@pytest.mark.parametrize("family", FAMILIES)
def test_conversations_have_several_turns_with_turn_rewards(agentic, family):
    res = agentic["families"][family]
    assert res["num_turns"] == res["turns"]  # the rollout counts the engine's requests
    assert max(res["turns"]) == TURNS and min(res["turns"]) >= 1
    # turn k scores k (ChattyUser): the row's turn rewards sum to 1 + 2 + … + turns
    assert res["turn_reward_sums"] == [t * (t + 1) / 2 for t in res["turns"]]


def test_a_rewritten_history_splits_the_conversation(agentic):
    split = agentic["split"]
    assert split["errors"] == []
    assert split["kept"] == {"splits": 0, "exact": True, "first_segment_exact": None, "prompt_kept": True}
    assert split["rewritten"] == {
        "splits": 1,
        "exact": True,
        "first_segment_exact": True,
        "prompt_kept": True,
    }
