"""3D-HybridEngine resharding on 4 ranks: every engine shard bit-exact, bytes received = the plan's floor.

One rank program (tests/multiproc/reshard_checks.py, in the 4-rank launch shared with other modules:
tests/multiproc/conftest.py) covers the layouts of issue 5: (t=2,p=2)->t_g 1|2, (t=2,p=1)->1|2,
(t=1,p=2)->1, (t=4,p=1)->2, each zero-redundancy and naive; a Qwen3-MoE at EP2/EP4 (with TP2 or PP2) into
engines with TP-sharded experts, and at TP2×EP2 and TP2×PP2 into an engine with expert parallelism (whole
experts, a block per engine rank).
"""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

CASES = ["t2p2->tg1", "t2p2->tg2", "t2p1->tg1", "t2p1->tg2", "t1p2->tg1", "t4p1->tg2"]


MOE_CASES = ["t1p1e2->tg1", "t2p1e2->tg1", "t2p1e2->tg2", "t1p2e2->tg1", "t1p1e4->tg1"]
# into an engine with expert parallelism: whole experts, point to point (no naive variant)
GEN_EP_CASES = ["t2p1e2->tg2ep", "t2p2e1->tg2ep"]


def _argv(request) -> list:
    from megarl.models.tiny import build_tiny_hf
    from tests.conftest import PARITY_INIT

    moe = build_tiny_hf(
        request.getfixturevalue("tmp_path_factory").mktemp("moe") / "m", "qwen3_moe", **PARITY_INIT
    )
    return [request.getfixturevalue("tiny_models")["qwen2"], moe]


SHARED_PART = ("reshard", "tests.multiproc.reshard_checks", _argv)


@pytest.fixture(scope="module")
def reshard(shared_launch):
    return shared_result(shared_launch, "reshard")


@pytest.mark.parametrize("case", CASES + MOE_CASES + GEN_EP_CASES + [c + "-naive" for c in CASES + MOE_CASES])
def test_every_engine_shard_equals_the_checkpoint_region(reshard, case):
    assert reshard[case]["max_abs_diff"] == 0.0
    assert reshard[case]["missing"] == []


@pytest.mark.parametrize("case", CASES + MOE_CASES + GEN_EP_CASES)
def test_zero_redundancy_path_receives_exactly_the_floor(reshard, case):
    assert reshard[case]["received"] == reshard[case]["floor"]


def test_engine_expert_parallelism_moves_what_the_plan_says(reshard):
    # TP2×EP2 -> engine EP2 (TP2): of an expert tensor's B bytes (summed over its experts) rank (tp j, ep k)
    # needs block j whole and holds half of block k: B, 2B, 2B, B, against B on every rank into an engine
    # with TP-sharded experts (tests/unit/distributed/test_generation_plan_experts.py); the dense part is
    # the same in both, so the difference is 0, B, B, 0
    ep, tp_sharded = reshard["t2p1e2->tg2ep"]["received"], reshard["t2p1e2->tg2"]["received"]
    extra = [a - b for a, b in zip(ep, tp_sharded)]
    assert extra[0] == extra[3] == 0 and extra[1] == extra[2] > 0, (ep, tp_sharded)


@pytest.mark.parametrize("case", ["t2p2->tg2", "t2p1->tg2", "t4p1->tg2"])
def test_naive_path_receives_more_when_generation_shards_are_smaller(reshard, case):
    naive, plan = reshard[case + "-naive"], reshard[case]
    assert all(n > 2 * p for n, p in zip(naive["received"], plan["received"]))


def test_buckets_stay_bounded(reshard):
    # 256 KiB buckets close between modules once full: under 256 KiB plus one module (the largest, the
    # 1001 x 128 fp32 embedding or output layer, 512 KB)
    sizes = {case: r["largest_bucket_bytes"] for case, r in reshard.items()}
    assert all(size < (256 << 10) + 1001 * 128 * 4 for size in sizes.values()), sizes
