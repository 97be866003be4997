"""The pool weight-sync plan: every engine rank's region arrives exactly once, from ranks that hold it,
spread over the training DP replicas, and its bytes equal the floor."""

import itertools

import pytest

from megarl.distributed.layout import LayoutError, ParallelLayout
from megarl.distributed.param_kind import ParamKind
from megarl.distributed.pool_plan import PoolSyncPlan, Slice, shard_dim

pytestmark = pytest.mark.unit

# One of each kind, shaped like the tiny test models (vocab 1001, hidden 128, 4 query / 2 kv heads of
# 32): (kind, full HF shape, owners, megatron's padded vocab rows for a training TP of 4 at most).
TABLE = [
    (ParamKind.VOCAB, (1001, 128), (0,), 1024),
    (ParamKind.QKV, (128, 128), (0,), None),  # q
    (ParamKind.QKV, (64, 128), (0,), None),  # k
    (ParamKind.ROW, (128, 128), (0,), None),
    (ParamKind.GATE_UP, (256, 128), (1,), None),  # gate
    (ParamKind.COLUMN, (96, 128), (1,), None),
    (ParamKind.REPLICATED, (128,), (1,), None),
    (ParamKind.VOCAB, (1001, 128), (0, 1), 1024),  # a tied embedding, held by both stages
]

TRAIN = [(tp, pp, dp) for tp in (1, 2, 4) for pp in (1, 2) for dp in (1, 2, 3)]
ENGINES = [(1, 1), (2, 1), (2, 2), (4, 2), (3, 1), (4, 4), (8, 2)]  # (engine_ranks, engine_tp)


def _table(pp: int):
    return [(k, s, tuple(o for o in owners if o < pp) or (0,), p) for k, s, owners, p in TABLE]


@pytest.mark.parametrize(("tp", "pp", "dp"), TRAIN)
def test_every_engine_region_arrives_exactly_once_from_holders_at_the_floor(tp, pp, dp):
    layout = ParallelLayout(world_size=tp * pp * dp, tp=tp, pp=pp)
    for engine_ranks, engine_tp in ENGINES:
        plan = PoolSyncPlan(layout, engine_ranks, engine_tp)
        for engine_rank in range(engine_ranks):
            received = floor = 0
            for kind, shape, owners, padded in _table(pp):
                dim = shard_dim(kind)
                length = shape[0 if dim is None else dim]
                slices = plan.slices(engine_rank, kind, length, owners, padded)
                start, stop = plan.engine_region(engine_rank, kind, length)
                # covered exactly once: sorted, contiguous, no overlap
                assert [s.start for s in slices][0] == start and slices[-1].stop == stop
                assert all(a.stop == b.start for a, b in zip(slices, slices[1:]))
                for s in slices:
                    c = layout.coordinates(s.train_rank)
                    assert c.pp == min(owners)  # from the owning stage (one owner for a tied copy)
                    lo, hi = plan.train_region(c.tp, kind, length, padded)
                    assert lo <= s.start < s.stop <= hi  # the sender holds it
                if not kind.tp_sharded:
                    assert len(slices) == 1  # replicated: whole, from one TP rank
                row = (shape[0] * shape[1] // length if len(shape) > 1 else 1) * 4
                received += sum(s.length for s in slices) * row
                floor += plan.floor_bytes(engine_rank, kind, shape, 4)
            assert received == floor


def test_the_floor_is_the_engine_shard_vllm_reads():
    layout = ParallelLayout(world_size=2, tp=2)
    plan = PoolSyncPlan(layout, engine_ranks=2, engine_tp=2)
    # vLLM pads 1001 rows to 1024 and gives each TP rank 512: rank 1 holds the 489 real ones
    assert plan.engine_region(0, "vocab", 1001) == (0, 512)
    assert plan.engine_region(1, "vocab", 1001) == (512, 1001)
    assert plan.floor_bytes(1, "vocab", (1001, 128), 4) == 489 * 128 * 4
    assert plan.floor_bytes(1, "row", (128, 256), 2) == 128 * 128 * 2
    assert plan.floor_bytes(1, "replicated", (128,), 4) == 512
    # training TP 4 (megatron pads to 1024 too: 256 rows each) into engine TP 2: two slices per rank
    plan = PoolSyncPlan(ParallelLayout(world_size=4, tp=4), engine_ranks=2, engine_tp=2)
    assert plan.slices(1, "vocab", 1001, (0,), 1024) == [Slice(2, 1, 512, 768), Slice(3, 1, 768, 1001)]


def test_intervals_intersect_when_neither_tp_divides_the_other():
    plan = PoolSyncPlan(ParallelLayout(world_size=2, tp=2), engine_ranks=3, engine_tp=3)
    # 96 rows: training halves [0,48) [48,96); engine thirds [0,32) [32,64) [64,96)
    assert plan.slices(1, "column", 96) == [Slice(0, 1, 32, 48), Slice(1, 1, 48, 64)]


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 1, 2), (1, 2, 3), (2, 2, 2)])
def test_engine_replicas_take_from_every_training_dp_replica(tp, pp, dp):
    layout = ParallelLayout(world_size=tp * pp * dp, tp=tp, pp=pp)
    plan = PoolSyncPlan(layout, engine_ranks=2 * dp, engine_tp=2)
    by_replica: dict[int, set[int]] = {}
    for engine_rank, (kind, shape, owners, padded) in itertools.product(range(2 * dp), _table(pp)):
        length = shape[0 if shard_dim(kind) is None else shard_dim(kind)]
        for s in plan.slices(engine_rank, kind, length, owners, padded):
            by_replica.setdefault(engine_rank // 2, set()).add(layout.coordinates(s.train_rank).dp)
    assert by_replica == {e: {e % dp} for e in range(dp)}  # one DP replica each, all of them used
    senders = {s.train_rank for r in range(layout.world_size) for s in plan.sends(r, "column", 96)}
    assert len(senders) == tp * dp  # every TP rank of every replica sends (on the owning stage)


def test_layouts_the_pool_cannot_take_are_refused_naming_the_keys():
    layout = ParallelLayout(world_size=2, tp=2)
    with pytest.raises(LayoutError, match=r"rollout.n_devices=3 must be a positive multiple of rollout.tp=2"):
        PoolSyncPlan(layout, engine_ranks=3, engine_tp=2)
    with pytest.raises(LayoutError, match=r"rollout.tp=4 does not divide num_key_value_heads=2"):
        PoolSyncPlan(layout, engine_ranks=4, engine_tp=4, num_kv_heads=2)
    with pytest.raises(LayoutError, match=r"actor.parallel.tp=4 does not divide num_key_value_heads=2"):
        PoolSyncPlan(ParallelLayout(world_size=4, tp=4), engine_ranks=2, engine_tp=2, num_kv_heads=2)
