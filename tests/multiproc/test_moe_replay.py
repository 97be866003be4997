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
