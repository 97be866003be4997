"""ParallelLayout's rank <-> coordinate maps are megatron's: every TP, CP, DP and PP group, and each rank's
position in it, equal what megatron-core's `RankGenerator` builds for `initialize_model_parallel` (the
same "tp-cp-ep-dp-pp" order), computed without any process group."""

import pytest
from megatron.core.parallel_state import RankGenerator

from megarl.distributed.layout import Coordinates, ParallelLayout

pytestmark = pytest.mark.unit

LAYOUTS = [  # (world_size, tp, pp, cp)
    (8, 2, 2, 1),
    (8, 4, 1, 1),
    (4, 1, 4, 1),
    (8, 1, 4, 1),
    (8, 2, 1, 2),
    (16, 2, 2, 2),
    (16, 1, 2, 2),
    (16, 8, 2, 1),
    (16, 2, 2, 1),
    (12, 3, 2, 1),
    (16, 1, 1, 1),
]


def _groups_of(generator: RankGenerator, token: str, world: int) -> list[list[int]]:
    """Entry r: the group of `token` that holds rank r, in megatron's member order."""
    by_rank: list[list[int]] = [[] for _ in range(world)]
    for group in generator.get_ranks(token):
        for rank in group:
            by_rank[rank] = group
    return by_rank


def _cp_group(layout: ParallelLayout, rank: int) -> list[int]:
    c = layout.coordinates(rank)
    return [layout.rank(Coordinates(c.tp, cp, c.dp, c.pp)) for cp in range(layout.cp)]


@pytest.mark.parametrize("world, tp, pp, cp", LAYOUTS, ids=lambda v: str(v))
def test_groups_and_coordinates_equal_megatrons(world, tp, pp, cp):
    layout = ParallelLayout(world_size=world, tp=tp, pp=pp, cp=cp)
    # As initialize_model_parallel builds its decoder ranks (experts use a second generator, with cp=1).
    generator = RankGenerator(tp=tp, ep=1, dp=layout.dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    ours = {
        "tp": (layout.tp_group_ranks, "tp"),
        "cp": (lambda r: _cp_group(layout, r), "cp"),
        "dp": (layout.dp_group_ranks, "dp"),
        "pp": (layout.pp_group_ranks, "pp"),
    }
    for token, (group_of, field) in ours.items():
        theirs = _groups_of(generator, token, world)
        for rank in range(world):
            assert group_of(rank) == theirs[rank], f"{token} group of rank {rank}"
            assert getattr(layout.coordinates(rank), field) == theirs[rank].index(rank)


EXPERT_LAYOUTS = [  # (world_size, tp, pp, cp, ep)
    (4, 1, 1, 1, 2),
    (4, 2, 1, 1, 2),
    (8, 2, 2, 1, 2),
    (8, 1, 1, 1, 4),
    (16, 2, 2, 1, 4),
    (16, 2, 1, 2, 2),
    (16, 1, 2, 2, 4),
]


@pytest.mark.parametrize("world, tp, pp, cp, ep", EXPERT_LAYOUTS, ids=lambda v: str(v))
def test_expert_groups_equal_megatrons(world, tp, pp, cp, ep):
    layout = ParallelLayout(world_size=world, tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=tp > 1)
    # initialize_model_parallel's second generator, for the experts (expert TP = TP here)
    generator = RankGenerator(tp=tp, ep=ep, dp=world // (tp * ep * pp), pp=pp, cp=1, order="tp-ep-dp-pp")
    for token, position in (("ep", 0), ("dp", 1)):
        theirs = _groups_of(generator, token, world)
        for rank in range(world):
            assert layout.expert_coordinates(rank)[position] == theirs[rank].index(rank), (token, rank)
    theirs = _groups_of(generator, "ep", world)
    assert [layout.ep_group_ranks(r) for r in range(world)] == theirs
