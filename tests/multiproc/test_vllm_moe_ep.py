"""Engine-side expert parallelism: a megatron Qwen3-MoE (TP2) resharded into a vLLM engine at TP2 with
expert parallelism (rollout.expert_parallel_size=2), on 2 ranks in the shared 2-rank launch
(tests/multiproc/vllm_moe_ep_checks.py): the engine, started from other weights, generates what
transformers fp32 generates with the pushed ones, and each rank receives exactly the plan's floor."""

from __future__ import annotations

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

LOG_PROB_TOL = 2e-5  # fp32, vLLM's CPU kernels against transformers' (as tests/multiproc/test_vllm_moe.py)


def _argv(request) -> list:
    from megarl.models.tiny import build_tiny_hf

    root = request.getfixturevalue("tmp_path_factory").mktemp("moe_ep")
    # initializer_range 0.1: router margins far above fp32 noise, so both sides route alike
    return [
        build_tiny_hf(root / f"seed{seed}", "qwen3_moe", seed=seed, initializer_range=0.1) for seed in (0, 1)
    ]


SHARED_PART_2 = ("vllm_moe_ep", "tests.multiproc.vllm_moe_ep_checks", _argv)


@pytest.fixture(scope="module")
def moe_ep(shared_launch_2):
    return shared_result(shared_launch_2, "vllm_moe_ep")


def test_each_engine_rank_holds_its_block_of_whole_experts(moe_ep):
    assert moe_ep["engine_block"] == [0, 1]  # rank 0's report; rank 1 holds experts 2 and 3
    assert moe_ep["engine_expert_tensors_per_layer"] == [2 * 3]  # 2 experts × gate, up, down


def test_the_pushed_weights_generate_what_transformers_does_with_them(moe_ep):
    assert moe_ep["before_log_prob_diff"] > 100 * LOG_PROB_TOL  # the engine started from other weights
    assert moe_ep["greedy_tokens_equal"]
    assert moe_ep["greedy_log_prob_diff"] <= LOG_PROB_TOL


def test_each_rank_receives_exactly_the_floor(moe_ep):
    # TP2 training, each rank half of every expert; its engine block of 2 experts whole: it lacks half of
    # them, as much as into an engine with TP-sharded experts, but point to point
    assert moe_ep["received"] == moe_ep["floor"]
    assert all(r > 0 for r in moe_ep["received"])
