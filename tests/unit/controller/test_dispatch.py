"""Dispatch modes as pure functions: split per rank, collect per replica, padding undone."""

import pytest
import torch

from megarl.controller.dispatch import Dispatch, RankInfo, collect, dispatch_mode_of, register, split
from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.layout import LayoutError, ParallelLayout
from megarl.protocol import Batch

pytestmark = pytest.mark.unit


def ranks_of(layout: ParallelLayout) -> list[RankInfo]:
    infos = []
    for r in range(layout.world_size):
        c = layout.coordinates(r)
        infos.append(RankInfo(r, c.dp, layout.dp, collect=c.pp == layout.pp - 1 and c.tp == 0 and c.cp == 0))
    return infos


def run(mode, ranks, *args, **kwargs):
    """What a worker group does: split, let each rank 'compute' (tag rows with its rank), collect."""
    calls, context = split(mode, args, kwargs, ranks)
    outputs = []
    for info, (a, _) in zip(ranks, calls):
        b = a[0]
        outputs.append(Batch(tensors={"x": b["x"], "rank": torch.full((len(b),), info.rank)}))
    return calls, collect(mode, outputs, ranks, context)


@pytest.mark.parametrize(
    "sizes, collectors",
    [({"tp": 2}, [0, 2]), ({"pp": 2}, [2, 3]), ({"tp": 2, "pp": 2}, [4, 6])],
)
def test_dp_compute_replicates_to_peers_and_collects_from_last_stage_tp0(sizes, collectors):
    ranks = ranks_of(ParallelLayout(world_size=8 if len(sizes) == 2 else 4, **sizes))
    batch = Batch(tensors={"x": torch.arange(10)})
    calls, out = run(Dispatch.DP_COMPUTE, ranks, batch)
    assert out["x"].tolist() == list(range(10))
    assert sorted(set(out["rank"].tolist())) == collectors
    for info, (args, _) in zip(ranks, calls):  # TP/PP peers of one replica get the same rows
        peers = [a for i, (a, _) in zip(ranks, calls) if i.dp_rank == info.dp_rank]
        assert all(torch.equal(p[0]["x"], args[0]["x"]) for p in peers)


def test_dp_compute_pads_then_removes_padding():
    ranks = ranks_of(ParallelLayout(world_size=4))
    calls, out = run(Dispatch.DP_COMPUTE, ranks, Batch(tensors={"x": torch.arange(10)}))
    assert [len(a[0]) for a, _ in calls] == [3, 3, 3, 3]
    assert out["x"].tolist() == list(range(10)) and out["rank"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


def test_padding_is_undone_when_each_input_row_yields_several_output_rows():
    """generate returns n samples per prompt, adjacent: a padded prompt's n samples all go."""
    ranks = ranks_of(ParallelLayout(world_size=4))
    calls, context = split(Dispatch.DP_COMPUTE, (Batch(tensors={"x": torch.arange(10)}),), {}, ranks)
    outputs = [Batch(tensors={"x": a[0]["x"].repeat_interleave(3)}) for a, _ in calls]  # n = 3 samples
    out = collect(Dispatch.DP_COMPUTE, outputs, ranks, context)
    assert out["x"].tolist() == torch.arange(10).repeat_interleave(3).tolist()


def test_dp_compute_replicates_non_batch_arguments():
    ranks = ranks_of(ParallelLayout(world_size=2))
    calls, _ = split(Dispatch.DP_COMPUTE, (Batch(tensors={"x": torch.arange(4)}), 0.5), {"step": 3}, ranks)
    assert all(a[1] == 0.5 and k == {"step": 3} for a, k in calls)


def test_one_to_all_rank_zero_all_to_all():
    ranks = ranks_of(ParallelLayout(world_size=3))
    calls, _ = split(Dispatch.ONE_TO_ALL, (7,), {}, ranks)
    assert [a for a, _ in calls] == [(7,)] * 3
    assert collect(Dispatch.RANK_ZERO, ["a", "b", "c"], ranks, None) == "a"
    calls, _ = split(Dispatch.ALL_TO_ALL, ([1, 2, 3],), {}, ranks)
    assert [a for a, _ in calls] == [(1,), (2,), (3,)]
    with pytest.raises(ValueError, match="list of 3 items"):
        split(Dispatch.ALL_TO_ALL, ([1, 2],), {}, ranks)


def test_inconsistent_rank_infos_are_rejected():
    bad = [RankInfo(0, 0, 2, True), RankInfo(1, 1, 2, False)]
    with pytest.raises(ValueError, match="one collecting rank per DP replica"):
        split(Dispatch.DP_COMPUTE, (Batch(tensors={"x": torch.arange(4)}),), {}, bad)


def test_register_marks_methods():
    @register(Dispatch.DP_COMPUTE)
    def f(self, batch):
        return batch

    assert dispatch_mode_of(f) is Dispatch.DP_COMPUTE and dispatch_mode_of(lambda: 0) is None


def gen_ranks_of(layout: ParallelLayout, rollout_tp: int) -> list[RankInfo]:
    infos, plan = [], GenerationPlan.for_layout(layout, rollout_tp)
    for info in ranks_of(layout):
        infos.append(
            RankInfo(
                info.rank,
                info.dp_rank,
                info.dp_size,
                info.collect,
                plan.gen_dp_rank(info.rank),
                plan.gen_dp_size,
                plan.gen_tp_rank(info.rank) == 0,
            )
        )
    return infos


def test_generation_replicas_follow_the_hybrid_engine_grouping():
    plan = GenerationPlan.build(tp=4, pp=1, dp=1, gen_tp=2)  # DESIGN §5: gen-TP groups [0,2] and [1,3]
    coords = [(plan.gen_dp_rank(r), plan.gen_tp_rank(r)) for r in range(4)]
    assert coords == [(0, 0), (1, 0), (0, 1), (1, 1)]
    pp_plan = GenerationPlan.build(tp=2, pp=2, dp=2, gen_tp=1)  # every PP stage becomes generation replicas
    assert [pp_plan.gen_dp_rank(r) for r in range(8)] == [0, 1, 4, 5, 2, 3, 6, 7]


def test_gen_dp_compute_uses_micro_dp_replicas_as_extra_data_parallel_ranks():
    ranks = gen_ranks_of(ParallelLayout(world_size=4, tp=4), rollout_tp=2)
    calls, out = run(Dispatch.GEN_DP_COMPUTE, ranks, Batch(tensors={"x": torch.arange(10)}))
    assert [len(a[0]) for a, _ in calls] == [5, 5, 5, 5]  # ranks 0,2 share replica 0; 1,3 replica 1
    assert torch.equal(calls[0][0][0]["x"], calls[2][0][0]["x"])
    assert out["x"].tolist() == list(range(10)) and out["rank"].tolist() == [0] * 5 + [1] * 5


def test_gen_dp_compute_needs_a_rollout_layout():
    with pytest.raises(ValueError, match="no generation layout"):
        split(
            Dispatch.GEN_DP_COMPUTE,
            (Batch(tensors={"x": torch.arange(4)}),),
            {},
            ranks_of(ParallelLayout(world_size=2)),
        )


def test_rollout_tp_must_divide_training_tp():
    with pytest.raises(LayoutError, match="rollout.tp=3 does not divide actor.parallel.tp=4"):
        GenerationPlan.for_layout(ParallelLayout(world_size=4, tp=4), 3)
