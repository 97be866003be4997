"""MoE routing replay (actor.router_replay R2/R3) through the workers on 4 ranks, against transformers
forced to the same routes: every layout (DP, EP2, TP2×EP2+SP, PP2, PP2×EP2), padded and packed
micro-batches (tests/multiproc/moe_replay_checks.py, in the shared 4-rank launch)."""

import pytest

from tests.multiproc.conftest import shared_result
from tests.multiproc.moe_replay_checks import LAYOUTS

pytestmark = pytest.mark.multiproc


def _argv(request) -> list:
    from megarl.models.tiny import build_tiny_hf
    from tests.conftest import PARITY_INIT

    root = request.getfixturevalue("tmp_path_factory").mktemp("moe_replay")
    return [build_tiny_hf(root / "qwen3_moe", "qwen3_moe", **PARITY_INIT)]


SHARED_PART = ("moe_replay", "tests.multiproc.moe_replay_checks", _argv)


@pytest.fixture(scope="module")
def launch(shared_launch) -> dict:
    return shared_result(shared_launch, "moe_replay")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_replayed_routes_give_transformers_log_probs_under_the_same_routes(launch, layout):
    r = launch[layout]
    assert r["r3_log_prob_vs_forced_hf"] <= 5e-5, r
    assert r["ref_vs_actor"] <= 1e-5, r


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_update_replays_the_routes_the_old_log_probs_took(launch, layout):
    r = launch[layout]
    assert r["update_ppo_kl"] <= 1e-6 and r["update_clip_frac"] == 0.0 and r["update_grad_norm"] > 0, r


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recorded_routes_are_transformers_top_k(launch, layout):
    r = launch[layout]
    assert r["live_routes_equal_hf_topk"] and r["live_routes_pad_missing"], r
    assert r["r2_recorded_equal_hf_topk"] and r["r2_recorded_pad_missing"], r


def test_replaying_the_engines_routes_removes_the_train_rollout_gap_they_cause(launch):
    """An engine whose routers are slightly off (weights perturbed by 5% of their std, every other weight
    the same) routes some tokens elsewhere; replaying its routes leaves only the gating weights' tiny
    difference."""
    r = launch["r3_effect"]
    print("\nR3 effect:", r)
    assert r["disagreement_token_share"] > 0.05, r
    assert r["without_r3_abs_diff_max"] > 1e-3, r
    assert r["with_r3_abs_diff_max"] < 0.35 * r["without_r3_abs_diff_max"], r
    assert r["with_r3_abs_diff_mean"] < 0.35 * r["without_r3_abs_diff_mean"], r
