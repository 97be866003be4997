"""Partial rollouts (megarl.rollout.partial): a weight sync after SYNC_AFTER engine steps of a sampled
generation (tiny Qwen2, temperature 1, n=3, tp_g=1), on the engine of test_vllm_rollout's one-rank
launch (its `vllm_single` part of the shared 1-rank launch; tests/multiproc/partial_rollout_checks.py)."""

from __future__ import annotations

import pytest

from tests.multiproc.conftest import shared_result
from tests.multiproc.partial_rollout_checks import SYNC_AFTER
from tests.multiproc.vllm_rollout_checks import RESPONSE

pytestmark = pytest.mark.multiproc

LOG_PROB_TOL = 2e-5


@pytest.fixture(scope="module")
def partial(shared_launch_1):
    return shared_result(shared_launch_1, "vllm_single")["partial"]


def test_stepping_without_a_sync_equals_the_one_call_path(partial):
    # sampled at temperature 1, not only greedy: the same requests with the same seeds
    assert partial["quiet"] == {
        "same_tokens": True,
        "same_log_probs": True,
        "same_finish": True,
        "versions_zero_on_tokens": True,
        "version_after": 0,
    }
    assert partial["steps"] >= SYNC_AFTER + 1


def test_the_sync_falls_mid_generation_with_samples_on_both_sides(partial):
    assert partial["rows_finished_before_sync"] >= 1
    assert partial["rows_across_sync"] >= 1
    assert partial["version_after"] == 1


def test_no_response_exceeds_its_budget(partial):
    assert max(partial["lengths"]) <= RESPONSE
    assert all(r == "length" for n, r in zip(partial["lengths"], partial["finish_reason"]) if n == RESPONSE)
    assert any(n == RESPONSE for n in partial["lengths"])  # the budget was reached across the sync


def test_each_token_carries_the_version_that_sampled_it(partial):
    # 0 on the first SYNC_AFTER tokens, 1 after, -1 on padding; each row's version is its oldest token's
    assert partial["versions_as_expected"]
    assert partial["row_versions"] == [0] * len(partial["lengths"])


def test_log_probs_are_those_of_the_weights_that_sampled_each_token(partial):
    assert partial["before_sync_vs_old_model"] <= LOG_PROB_TOL
    assert partial["after_sync_vs_new_model"] <= LOG_PROB_TOL
    assert partial["after_sync_vs_old_model"] > 100 * LOG_PROB_TOL


def test_samples_finished_before_the_sync_and_earlier_tokens_are_untouched(partial):
    assert partial["finished_rows_untouched"]
    assert partial["tokens_before_sync_kept"]


def test_a_failing_callback_aborts_the_requests_and_reaches_the_caller(partial):
    faults = partial["faults"]
    assert faults["raises"] == {"raised": "RuntimeError: weight receive failed", "engine_idle": True}
    assert faults["stale_version"] == {
        "raised": "MegarlError: between_steps returned weights version 1, not newer than the engine's 1; "
        "return None when nothing changed",
        "engine_idle": True,
    }
    assert faults["generates_after"] == 12
