"""The 3D-HybridEngine plan: hand-checked groups for small layouts, and a brute-force simulation (shards
as sets of (layer, TP slice) items) showing every rank ends with exactly its generation shard after
receiving exactly the plan's bytes."""

import itertools

import pytest

from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.layout import LayoutError, ParallelLayout
from megarl.distributed.param_kind import ParamKind

pytestmark = pytest.mark.unit

REPLICATED = ParamKind.REPLICATED
TP_SHARDED_KINDS = [kind for kind in ParamKind if kind.tp_sharded]

# (tp, pp, dp, gen_tp) -> gen-TP groups (= replicas, by gen DP rank), micro-DP groups, gather groups,
# gen DP rank and gen TP rank of each rank. Rank = tp + t·(dp + d·pp).
HAND_CHECKED = {
    (2, 2, 1, 1): ([[0], [1], [2], [3]], [[0, 1, 2, 3]], [[0, 1], [2, 3]], [0, 1, 2, 3], [0, 0, 0, 0]),
    (2, 2, 1, 2): ([[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1], [2], [3]], [0, 0, 1, 1], [0, 1, 0, 1]),
    (2, 1, 2, 1): ([[0], [1], [2], [3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]], [0, 1, 2, 3], [0, 0, 0, 0]),
    (2, 1, 2, 2): ([[0, 1], [2, 3]], [[0], [1], [2], [3]], [[0], [1], [2], [3]], [0, 0, 1, 1], [0, 1, 0, 1]),
    (1, 2, 2, 1): ([[0], [2], [1], [3]], [[0, 2], [1, 3]], [[0], [1], [2], [3]], [0, 2, 1, 3], [0, 0, 0, 0]),
    (4, 1, 1, 2): ([[0, 2], [1, 3]], [[0, 1], [2, 3]], [[0, 1], [2, 3]], [0, 1, 0, 1], [0, 0, 1, 1]),
    (4, 1, 2, 2): (  # DESIGN §5's example, twice
        [[0, 2], [1, 3], [4, 6], [5, 7]],
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [0, 1, 0, 1, 2, 3, 2, 3],
        [0, 0, 1, 1, 0, 0, 1, 1],
    ),
    (2, 2, 2, 1): (
        [[0], [1], [4], [5], [2], [3], [6], [7]],
        [[0, 1, 4, 5], [2, 3, 6, 7]],
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [0, 1, 4, 5, 2, 3, 6, 7],
        [0] * 8,
    ),
}


@pytest.mark.parametrize("sizes", list(HAND_CHECKED), ids=lambda s: "t{}p{}d{}-tg{}".format(*s))
def test_groups_match_hand_checked_layouts(sizes):
    gen_tp_groups, micro_dp_groups, gather_groups, gen_dp, gen_tp = HAND_CHECKED[sizes]
    plan = GenerationPlan.build(*sizes)
    world = plan.layout.world_size
    assert plan.gen_tp_groups == gen_tp_groups
    assert plan.micro_dp_groups == micro_dp_groups
    assert plan.gather_groups == gather_groups
    assert [plan.gen_dp_rank(r) for r in range(world)] == gen_dp
    assert [plan.gen_tp_rank(r) for r in range(world)] == gen_tp
    assert plan.gen_dp_size == world // sizes[3] == len(gen_tp_groups)


def simulate(plan: GenerationPlan, layers_per_stage: int, slice_bytes: int, norm_bytes: int) -> None:
    """Move (layer, slice) items as the plan says and check holdings and bytes against the plan.

    Each layer is a TP-sharded matrix of t slices (slice_bytes each) plus a replicated norm (norm_bytes).
    """
    layout, s = plan.layout, plan.stride
    t, p, world = layout.tp, layout.pp, layout.world_size
    stage_layers = {q: range(q * layers_per_stage, (q + 1) * layers_per_stage) for q in range(p)}
    owner = {layer: q for q, ls in stage_layers.items() for layer in ls}
    size = {
        **{(layer, i): slice_bytes for layer in owner for i in range(t)},
        **{(layer, "norm"): norm_bytes for layer in owner},
    }

    def training_shard(rank):
        c = layout.coordinates(rank)
        return {(layer, c.tp) for layer in stage_layers[c.pp]} | {
            (layer, "norm") for layer in stage_layers[c.pp]
        }

    def generation_shard(rank):
        g = plan.gen_tp_rank(rank)
        return {(layer, i) for layer in owner for i in range(g * s, (g + 1) * s)} | {
            (layer, "norm") for layer in owner
        }

    held = {r: training_shard(r) for r in range(world)}
    received = dict.fromkeys(range(world), 0)

    def gather(groups_of):
        before = {r: set(items) for r, items in held.items()}
        for r in range(world):
            incoming = set().union(*(before[peer] for peer in groups_of(r) if peer != r)) - held[r]
            received[r] += sum(size[i] for i in incoming)
            held[r] |= incoming

    gather(layout.pp_group_ranks)  # owners broadcast their layers over the training PP group
    gather(plan.gather_group)  # then all-gather inside each run of s ranks

    sharded_bytes = len(owner) * t * slice_bytes
    for r in range(world):
        assert held[r] == generation_shard(r), f"rank {r}"
        expected = sum(plan.received_bytes(r, t * slice_bytes, "column", owner[layer]) for layer in owner)
        expected += sum(plan.received_bytes(r, norm_bytes, REPLICATED, owner[layer]) for layer in owner)
        assert received[r] == expected
        # Sharded part: exactly the DESIGN floor; replicated part: whole norms of the other stages.
        assert received[r] == plan.floor_bytes(sharded_bytes) + (p - 1) * layers_per_stage * norm_bytes
        for layer in owner:
            sources = plan.shard_sources(r, owner[layer])
            assert [(layer, layout.coordinates(src).tp) for src in sources] == sorted(
                i for i in generation_shard(r) if i[0] == layer and i[1] != "norm"
            )

    for group in plan.micro_dp_groups:  # zero redundancy: the group holds its generation shard exactly once
        sharded = [i for r in group for i in training_shard(r) if i[1] != "norm"]
        assert len(sharded) == len(set(sharded))
        assert set(sharded) == {i for i in generation_shard(group[0]) if i[1] != "norm"}
        assert {plan.gen_tp_rank(r) for r in group} == {plan.gen_tp_rank(group[0])}
        assert sorted(plan.gen_dp_rank(r) % plan.micro_dp_size for r in group) == list(
            range(plan.micro_dp_size)
        )

    for replica, group in enumerate(plan.gen_tp_groups):  # each replica holds the whole model once
        assert [(plan.gen_dp_rank(r), plan.gen_tp_rank(r)) for r in group] == [
            (replica, j) for j in range(len(group))
        ]
        assert set().union(*(generation_shard(r) for r in group)) == set(size)
    assert sorted(r for g in plan.gen_tp_groups for r in g) == list(range(world))


def simulate_naive(plan: GenerationPlan, layers: int, chunk_bytes: int) -> None:
    """Every rank contributes a distinct 1/(t·p·d) of the model and gathers the rest from everyone."""
    layout = plan.layout
    items = {(layer, i, k) for layer in range(layers) for i in range(layout.tp) for k in range(layout.dp)}
    per_stage = layers // layout.pp
    own = {}
    for r in range(layout.world_size):
        c = layout.coordinates(r)
        own[r] = {(layer, c.tp, c.dp) for layer in range(c.pp * per_stage, (c.pp + 1) * per_stage)}
    assert set().union(*own.values()) == items
    model_bytes = len(items) * chunk_bytes
    for r in range(layout.world_size):
        incoming = set().union(*(own[peer] for peer in own if peer != r))
        assert incoming | own[r] == items
        assert len(incoming) * chunk_bytes == plan.naive_bytes(model_bytes)


LAYOUTS = [
    (t, p, d, tg)
    for t, p, d in itertools.product((1, 2, 4, 8), (1, 2, 3), (1, 2))
    for tg in (1, 2, 4, 8)
    if t % tg == 0
]


def test_every_rank_ends_with_its_generation_shard_after_receiving_the_floor():
    for sizes in LAYOUTS:
        plan = GenerationPlan.build(*sizes)
        simulate(plan, layers_per_stage=2, slice_bytes=12, norm_bytes=5)
        simulate_naive(plan, layers=2 * sizes[1], chunk_bytes=7)


@pytest.mark.parametrize(
    "sizes, floor, naive",
    [
        ((2, 2, 1, 1), 0.75, 0.75),
        ((2, 2, 1, 2), 0.25, 0.75),
        ((4, 1, 2, 2), 0.25, 0.875),
        ((4, 1, 1, 4), 0.0, 0.75),
        ((1, 1, 1, 1), 0.0, 0.0),
        ((8, 4, 2, 2), 30 / 64, 63 / 64),
    ],
)
def test_floor_and_naive_fractions_of_the_model(sizes, floor, naive):
    plan = GenerationPlan.build(*sizes)
    assert plan.floor_bytes(2**30) == pytest.approx(floor * 2**30, rel=1e-12, abs=0)
    assert plan.naive_bytes(2**30) == pytest.approx(naive * 2**30, rel=1e-12, abs=0)


def test_received_bytes_per_parameter_kind():
    plan = GenerationPlan.build(tp=4, pp=2, dp=1, gen_tp=2)  # stage 0: ranks 0-3, stage 1: ranks 4-7
    full = 4 * 1000
    for kind in TP_SHARDED_KINDS:
        assert plan.received_bytes(1, full, kind, 0) == 1000  # holds 1 of the 2 training shards it needs
        assert plan.received_bytes(5, full, kind, 0) == 2000  # holds neither
    assert plan.received_bytes(1, 64, REPLICATED, 0) == 0
    assert plan.received_bytes(5, 64, REPLICATED, 0) == 64
    # A tied embedding kept on the first and the last stage is held on both.
    assert plan.received_bytes(5, full, "vocab", (0, 1)) == 1000


def test_the_plan_imports_without_torch():
    # The plan is pure layout arithmetic (the driver and config validation use it): no torch, no converter.
    import subprocess
    import sys

    code = "import sys, megarl.distributed.generation_plan; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: GenerationPlan.build(4, 1, 1, 3),
            r"rollout.tp=3 does not divide actor.parallel.tp=4 \(.*\); use one of 1, 2, 4",
        ),
        (lambda: GenerationPlan.build(4, 1, 1, 0), r"rollout.tp=0 must be ≥ 1"),
        (
            lambda: GenerationPlan.build(4, 1, 1, 4, num_kv_heads=2),
            r"rollout.tp=4 does not divide num_key_value_heads=2 .*use one of 1, 2",
        ),
        (lambda: GenerationPlan.build(2, 1, 0, 1), r"dp=0 must be ≥ 1"),
        (
            lambda: GenerationPlan.for_layout(ParallelLayout(world_size=4, tp=2, cp=2), 1),
            "cp=2: the 3D-HybridEngine does not support context parallelism; set actor.parallel.cp=1",
        ),
    ],
)
def test_impossible_plans_say_how_to_fix(call, message):
    with pytest.raises(LayoutError, match=message):
        call()


def test_misused_accounting_is_refused():
    plan = GenerationPlan.build(tp=2, pp=2, dp=1, gen_tp=1)
    with pytest.raises(ValueError, match="unknown parameter kind 'fused'"):
        plan.received_bytes(0, 8, "fused", 0)
    with pytest.raises(ValueError, match="does not split into tp=2 equal shards"):
        plan.received_bytes(0, 7, "row", 0)
    with pytest.raises(ValueError, match="owner stage 2 is not a PP stage of pp=2"):
        plan.received_bytes(0, 8, "row", 2)


def test_describe_lists_each_rank_and_the_byte_budget():
    text = GenerationPlan.build(tp=4, pp=1, dp=2, gen_tp=2).describe(model_bytes=2**30, max_ranks=4)
    lines = text.splitlines()
    assert lines[0].startswith("3D-HybridEngine plan: training tp4xpp1xdp2 (8 ranks) -> generation tp2 x dp4")
    assert lines[2].split() == ["0", "0/0/0", "0", "0", "[0,2]", "[0,1]", "[0,1]"]
    assert lines[5].split() == ["3", "3/0/0", "1", "1", "[1,3]", "[2,3]", "[2,3]"]
    assert "4 more ranks" in lines[6]
    assert "floor 0.250 GiB (0.2500 M), naive all-gather 0.875 GiB (0.8750 M)" in lines[7]
