"""VLLMRollout on tiny mixture-of-experts checkpoints (Qwen3-MoE; Qwen2-MoE with a shared expert and an
expert size the CPU kernel pads, 48 → 64) against transformers fp32: log-probs, the routes the engine
records for routing replay (R3), and both after a weight sync. One rank, in the shared 1-rank launch
(tests/multiproc/vllm_moe_checks.py)."""

from __future__ import annotations

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

LOG_PROB_TOL = 2e-5  # fp32, vLLM's CPU kernels against transformers' (seen: ≤ 2.9e-6)
FAMILIES = {"qwen3_moe": {}, "qwen2_moe": {"moe_intermediate_size": 48}}


def _argv(request) -> list:
    from megarl.models.tiny import build_tiny_hf

    root = request.getfixturevalue("tmp_path_factory").mktemp("moe")
    # initializer_range 0.1: router margins far above fp32 noise, so both sides route alike
    return [build_tiny_hf(root / f, f, initializer_range=0.1, **extra) for f, extra in FAMILIES.items()]


SHARED_PART_1 = ("vllm_moe", "tests.multiproc.vllm_moe_checks", _argv)


@pytest.fixture(scope="module")
def moe(shared_launch_1):
    return shared_result(shared_launch_1, "vllm_moe")


@pytest.mark.parametrize("family", FAMILIES)
def test_route_recording_engine_runs_without_prefix_caching(moe, family):
    assert moe[family]["prefix_caching"] is False


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize("family", FAMILIES)
def test_moe_log_probs_match_hf_fp32_before_and_after_a_weight_sync(moe, family, phase):
    """`after`: the weights moved and pushed through load_weights; without vllm_moe's repack the experts
    are garbage (|Δ log-prob| ≈ 3) or the push fails on the padded expert size."""
    got = moe[family][phase]
    assert got["greedy_tokens_equal"]
    assert got["greedy_log_prob_diff"] <= LOG_PROB_TOL
    assert got["sampled_log_prob_diff"] <= LOG_PROB_TOL


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_routes_are_hfs_top_k_at_every_forwarded_position(moe, family, phase):
    for name, rows in [("greedy_routes", 4), ("sampled_routes", 8)]:  # 4 prompts; n = 1, then n = 2
        routes = moe[family][phase][name]
        assert routes["shape"] == [rows, 18, 4, 2]  # P + R = 8 + 10, 4 MoE layers, top-2
        assert routes["dtype"] == "torch.int16"
        assert routes["positions"] > 0 and routes["equal"] == routes["positions"], routes
        assert routes["sentinel_elsewhere"]


def test_moe_sync_goes_through_vllms_reload(moe):
    assert {m["loader"] for m in moe.values()} == {"reload_weights"}


@pytest.mark.parametrize("family", FAMILIES)
def test_push_of_part_of_a_layers_experts_is_refused(moe, family):
    """vLLM leaves such a layer half-loaded: its outputs were NaN."""
    error = moe[family]["part_of_the_experts"]
    assert error is not None and "model.layers.3.mlp.experts.3.down_proj.weight" in error
