"""The 3D-HybridEngine plan for experts (training EP): hand-checked bytes for the issue's cases, and a
brute-force simulation (each expert tensor as a set of (layer, expert, TP slice) items) showing that the
schedule PP broadcast → EP broadcast → dense gather leaves every rank with exactly its engine's experts
after receiving exactly `expert_received_bytes`, and that the engine-EP floor is what a rank lacks."""

import itertools

import pytest

from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.layout import ParallelLayout

pytestmark = pytest.mark.unit

B = 1200  # one expert's full tensor, divisible by every tp below


def layer_bytes(plan: GenerationPlan, rank: int, experts: int, kind: str, stage: int) -> int:
    """What `rank` receives of one expert tensor of one layer, over all experts."""
    return sum(plan.expert_received_bytes(rank, B, x, experts, kind, stage) for x in range(experts))


def plan_for(world: int, tp: int, pp: int, ep: int, gen_tp: int, gen_ep: bool = False) -> GenerationPlan:
    layout = ParallelLayout(world_size=world, tp=tp, pp=pp, ep=ep, sequence_parallel=tp > 1)
    return GenerationPlan.for_layout(layout, gen_tp, gen_ep=gen_ep)


@pytest.mark.parametrize(
    "sizes, gen_ep, expected",
    [
        # EP2 at tp1 (2 ranks) -> engine TP1: every rank lacks the other rank's 2 experts, whole
        ((2, 1, 1, 2, 1), False, [2 * B, 2 * B]),
        # tp2 × EP2 (4 ranks) -> engine TP2: half of the 2 experts held by the other EP rank
        ((4, 2, 1, 2, 2), False, [B, B, B, B]),
        # tp2 × EP2 -> engine TP1: all 4 experts whole, less the half of 2 it holds
        ((4, 2, 1, 2, 1), False, [3 * B, 3 * B, 3 * B, 3 * B]),
        # tp2 × EP2 -> engine EP2 (TP2): rank (tp j, ep k) needs experts of block j whole; holds block k at half
        ((4, 2, 1, 2, 2), True, [B, 2 * B, 2 * B, B]),
    ],
)
def test_bytes_for_the_issues_cases(sizes, gen_ep, expected):
    plan = plan_for(*sizes, gen_ep=gen_ep)
    assert [layer_bytes(plan, r, 4, "gate_up", 0) for r in range(sizes[0])] == expected


LAYOUTS = [
    (world, t, p, e, tg)
    for world in (2, 4, 8, 16)
    for t, p, e in itertools.product((1, 2, 4), (1, 2), (1, 2, 4))
    for tg in (1, 2, 4)
    if world % (t * p) == 0 and (world // (t * p)) % e == 0 and t % tg == 0
]


def held(plan: GenerationPlan, rank: int, experts: int, layers_per_stage: int) -> set:
    """(layer, expert, TP slice) items `rank` holds in training."""
    c = plan.layout.coordinates(rank)
    layers = range(c.pp * layers_per_stage, (c.pp + 1) * layers_per_stage)
    return {(layer, x, c.tp) for layer in layers for x in plan.training_experts(rank, experts)}


def test_every_rank_ends_with_its_engines_experts_after_receiving_the_floor():
    experts, layers_per_stage = 8, 2
    for world, t, p, e, tg in LAYOUTS:
        plan = plan_for(world, t, p, e, tg)
        layout = plan.layout
        for rank in range(world):
            # 1. PP broadcast: the same TP and EP rank's shards of every stage's layers
            after_pp = set().union(
                *(held(plan, r, experts, layers_per_stage) for r in layout.pp_group_ranks(rank))
            )
            # 2. EP broadcast: every expert, this TP slice
            after_ep = set().union(
                *(
                    held(plan, q, experts, layers_per_stage)
                    for r in layout.ep_group_ranks(rank)
                    for q in layout.pp_group_ranks(r)
                )
            )
            # 3. dense gather inside the gather group
            final = set().union(
                *(
                    {(layer, x, layout.coordinates(g).tp) for (layer, x, _) in after_ep}
                    for g in plan.gather_group(rank)
                )
            )
            needed = {
                (layer, x, j * plan.stride + i)
                for layer in range(p * layers_per_stage)
                for x in plan.engine_experts(rank, experts)
                for j in [plan.gen_tp_rank(rank)]
                for i in range(plan.stride)
            }
            assert final == needed, (world, t, p, e, tg, rank)
            mine = held(plan, rank, experts, layers_per_stage)
            assert mine <= after_pp <= after_ep <= final  # each step receives only items it lacks
            received = len(after_pp - mine) + len(after_ep - after_pp) + len(final - after_ep)
            floor = layers_per_stage * sum(
                layer_bytes(plan, rank, experts, "row", stage) for stage in range(p)
            )
            assert received * (B // t) == floor, (world, t, p, e, tg, rank)


def test_engine_ep_floor_is_what_a_rank_lacks_of_its_block():
    experts = 8
    for world, t, p, e, tg in LAYOUTS:
        plan = plan_for(world, t, p, e, tg, gen_ep=True)
        for rank in range(world):
            c = plan.layout.coordinates(rank)
            block = plan.engine_experts(rank, experts)
            assert len(block) == experts // tg and block.start == plan.gen_tp_rank(rank) * len(block)
            mine = set(plan.training_experts(rank, experts)) & set(block)
            for stage in range(p):
                held = len(mine) * (B // t) if stage == c.pp else 0
                assert layer_bytes(plan, rank, experts, "gate_up", stage) == len(block) * B - held


def test_experts_that_do_not_split_are_refused():
    plan = plan_for(4, 2, 1, 2, 2, gen_ep=True)
    with pytest.raises(ValueError, match="actor.parallel.ep=2 does not divide the model's 3 experts"):
        plan.training_experts(0, 3)
    with pytest.raises(ValueError, match="rollout.tp=2 does not divide"):
        plan.engine_experts(0, 5)
    with pytest.raises(ValueError, match="does not split into tp=2"):
        plan.expert_received_bytes(0, 1201, 0, 4, "row", 0)
    with pytest.raises(ValueError, match="does not split"):
        plan.expert_received_bytes(0, B, 0, 4, "replicated", 0)
