"""The 3D-HybridEngine end to end on 4 ranks: after optimizer updates, the colocated vLLM engine's
log-probs of its sampled tokens equal Megatron's recomputed ones, and the weight sync receives exactly
the plan's floor. Layouts of issue 5, all in one rank program (tests/multiproc/hybrid_checks.py) in the
4-rank launch shared with other modules (tests/multiproc/conftest.py): a launch costs more than a case
(≈ 24 s each: a worker group and a vLLM engine).

Which case covers what:
- t2p2g2: TP2 to TP2 groups through PP (PP broadcast, no TP regrouping), full syncs after an update.
- t1p2g1: PP stages to TP1 engines (replica order DP first, then PP stage), full syncs after an update.
- t2p2g1a: TP2 × PP2 to TP1 engines (PP broadcast and TP gather into whole tensors): its first sync moves
  every base tensor through the plain path's resharder (megarl.hybrid.lora_sync: `base.buckets`), which
  writes them over the engine's weights, so a wrong regrouping fails its log-prob check; then LoRA
  adapters alone, each engine rank its region.
- t4p1g2a: TP4 to TP2 engines, strided groups: the same base-then-adapters syncs, q/k/v without adapters.
- t2p1g2m: TP2 to TP2 without PP: every tensor at its first sync, then the merged linears alone.
Left out as covered: plain t2p2g1 and t4p1g2 (their layouts' base syncs are the first syncs of t2p2g1a and
t4p1g2a; a full sync after an update is t2p2g2's and t1p2g1's), t2p1g1 (TP-to-TP1 regrouping: t2p2g1a,
t1p2g1), plain t2p1g2 (t2p2g2 syncs the same TP2-to-TP2 groups through PP, t2p1g2m runs its layout)."""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

# "a": LoRA synced as adapters (engine TP1 from PP2 × TP2 shards; engine TP2 from TP4 shards), "m": LoRA
# merged into the base weights
CASES = ["t2p2g2", "t1p2g1", "t2p2g1a", "t4p1g2a", "t2p1g2m"]
# generation TP groups: strided by t/t_g inside each training TP group
EXPECTED_GROUPS = {
    "t2p2g1": [[0], [1], [2], [3]],
    "t2p2g2": [[0, 1], [2, 3]],
    "t2p1g2": [[0, 1], [2, 3]],
    "t1p2g1": [[0], [2], [1], [3]],  # replica order: DP first, then PP stage
    "t4p1g2": [[0, 2], [1, 3]],
}


SHARED_PART = (
    "hybrid",
    "tests.multiproc.hybrid_checks",
    lambda request: [request.getfixturevalue("tiny_models")["qwen2"], *CASES],
)


@pytest.fixture(scope="module")
def cases(shared_launch) -> dict:
    return shared_result(shared_launch, "hybrid")


def test_engine_log_probs_equal_megatron_after_updates(cases):
    for case, result in cases.items():
        assert all(d <= 2e-5 for d in result["max_abs_logprob_diff"]), (case, result["max_abs_logprob_diff"])
        # the updates really moved the policy, so a stale engine could not pass the check above
        assert all(m > 1e-2 for m in result["update_moved_logprobs"]), (case, result["update_moved_logprobs"])
        assert result["responses"] > 0, case


def test_weight_sync_receives_exactly_the_floor(cases):
    for case, result in cases.items():
        assert all(r == [1.0] * 4 for r in result["bytes_over_floor"]), (case, result["bytes_over_floor"])


def test_engine_runs_with_the_plan_groups(cases):
    for case, result in cases.items():
        expected = EXPECTED_GROUPS[case.rstrip("am")]
        assert result["engine_groups"] == expected, case
        expected_per_rank = [next(g for g in expected if r in g) for r in range(4)]
        assert result["engine_ranks"] == expected_per_rank, case


LORA_TENSORS = 4 * 7 * 2  # the tiny model's 4 layers × 7 projections × (A, B)


def test_lora_moves_the_base_once_then_adapters_or_merged_linears_only(cases):
    """After the first sync (every base tensor) an adapter sync hands the engine the adapter tensors
    alone, and a merged one the 7 targeted linears of each layer alone (with Qwen2's q/k/v biases: the
    engine loads a layer whole); the engine served each step's
    adapter (the log-prob check above, and actor.lora.check_sync compared checksums every sync)."""
    # at TP4 (above the 2 key/value heads) q/k/v carry no adapter: 4 projections per layer
    for case, adapters in (("t2p2g1a", LORA_TENSORS), ("t4p1g2a", LORA_TENSORS * 4 // 7)):
        first, *later = cases[case]["moved"]
        assert first["tensors"] > adapters and first["adapter"] > 0, (case, first)
        for sync in later:
            assert sync["tensors"] == adapters and sync["adapter"] > 0, (case, sync)
    first, *later = cases["t2p1g2m"]["moved"]
    merged = LORA_TENSORS // 2 + 4 * 3  # 7 weights and q/k/v biases per layer
    assert first["tensors"] > merged and first["adapter"] == 0
    for sync in later:
        assert sync["tensors"] == merged and sync["adapter"] == 0, sync
