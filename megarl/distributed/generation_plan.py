"""The 3D-HybridEngine's resharding plan: which ranks form the generation layout, and what moves (pure).

Training runs at t (TP) × p (PP) × d (DP); the colocated rollout engine runs at t_g (TP) with t_g | t and
p_g = 1, so every generation replica holds all layers. With s = t / t_g (DESIGN §5, HybridFlow §5):

  generation TP group   ranks of one training TP group and PP stage at stride s: one generation replica.
                        There are world / t_g replicas; replica i serves the i-th of the world / t_g
                        prompt chunks (Dispatch.GEN_DP_COMPUTE). Generation TP rank = training TP rank // s.
  micro-DP group        the d_g = p·s ranks of one training replica that share a generation TP rank: the
                        runs of s consecutive ranks inside a training TP group, on every PP stage. Each
                        member belongs to a different generation replica; together they hold their
                        generation shard of every layer exactly once, so gathering inside the group gives
                        each member that shard and nothing else (zero redundancy).
  gather group          the micro-DP group's ranks on one PP stage (one run of s consecutive ranks).

What each rank receives: its generation shard of every parameter (for a TP-sharded parameter, the
training shards of ranks `shard_sources(rank, owner_stage)` concatenated by kind; a replicated one
whole), less what it already holds. One schedule that moves exactly that: (1) each PP stage broadcasts
its parameters over the training PP group, so every rank holds its training TP shard of every layer;
(2) all-gather inside the gather group. Any schedule in which a rank receives only bytes it lacks, once,
moves the same bytes: `received_bytes` is that floor, per parameter, for the reshard to compare with
the bytes it measures.

For a model of M bytes that is entirely TP-sharded and spread evenly over the PP stages, every rank
receives `floor_bytes(M)` = M/t_g − M/(t·p) = (t·p − t_g)/(t_g·t·p)·M. Replicated tensors (norms) break
the first assumption: a rank needs them whole and its stage already holds its own whole, so one of B bytes
costs 0 on its owning stage and B elsewhere — (p − 1)/p·B per rank on average instead of the formula's
(t·p − t_g)/(t_g·t·p)·B (less when p = 1, more when t_g = t and p > 1). Stages holding unequal shares
(embedding and output layer at the ends) make the exact floor differ from rank to rank; summing
`received_bytes` over the model's parameters gives each rank's exact floor.

Experts (training EP = e): rank r holds experts [k·E/e, (k+1)·E/e) of its stage's MoE layers, k its expert-
parallel rank (megatron's "tp-ep-dp-pp" layout), each TP-sharded like a dense MLP. The engine holds either
every expert TP-sharded like the dense layers (`gen_ep=False`, vLLM's default) or whole experts split over
its TP ranks (`gen_ep=True`, vLLM's enable_expert_parallel: generation TP rank j holds experts
[j·E/t_g, (j+1)·E/t_g)). `expert_received_bytes` is what a rank needs of one expert's tensor, less what it
holds. With gen_ep=False one schedule meets it: the PP broadcast, a
broadcast of each expert's shard from its EP rank over the EP group, then the dense gather. With gen_ep
another does: each training TP shard of an expert goes point to point from one rank holding it to each
rank whose block holds the expert and lacks that shard (megarl.hybrid.reshard).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from megarl.distributed.layout import (
    Coordinates,
    LayoutError,
    LayoutKeys,
    ParallelLayout,
    ParallelSizes,
    divisors,
)
from megarl.distributed.param_kind import ParamKind

# The actor is the role that generates: the plan's problem lines name its config keys unless told otherwise.
ACTOR_KEYS = LayoutKeys("actor.parallel")


@dataclass(frozen=True)
class GenerationPlan:
    """The generation layout of a training layout at generation TP `gen_tp`, and the bytes resharding moves.

    Build it with `GenerationPlan.build(tp, pp, dp, gen_tp)` or `GenerationPlan.for_layout(layout, gen_tp)`.
    Rank lists are global ranks of the training world; every rank computes the same lists, so they can be
    passed as-is to `torch.distributed.new_group` in order.
    """

    layout: ParallelLayout
    gen_tp: int
    num_kv_heads: int | None = None  # the model's key/value heads, when known: they must split over gen_tp
    gen_ep: bool = False  # the engine splits whole experts over its TP ranks instead of TP-sharding each

    def __post_init__(self) -> None:
        problems = GenerationPlan.check(self.layout, self.gen_tp, self.num_kv_heads)
        if problems:
            raise LayoutError(problems)

    @staticmethod
    def check(
        parallel: ParallelSizes,
        gen_tp: int,
        num_kv_heads: int | None = None,
        keys: LayoutKeys = ACTOR_KEYS,
        gen_key: str = "rollout.tp",
    ) -> list[str]:
        """Every rule a generation layout at TP `gen_tp` of training layout `parallel` must obey, as problem
        lines naming `gen_key` and the training sizes by `keys`."""
        problems = []
        if gen_tp < 1:
            problems.append(f"{gen_key}={gen_tp} must be ≥ 1; e.g. 1")
        elif parallel.tp >= 1:  # a training tp < 1 is ParallelLayout.check's to report
            limits = [(keys.key("tp"), parallel.tp)]
            if num_kv_heads is not None:
                limits.append(("num_key_value_heads", num_kv_heads))
            failed = [f"{name}={n}" for name, n in limits if n % gen_tp]
            if failed:
                fits = ", ".join(map(str, divisors(math.gcd(*(n for _, n in limits)))))
                problems.append(
                    f"{gen_key}={gen_tp} does not divide {' and '.join(failed)} (each generation TP rank holds "
                    f"whole training TP shards and whole key/value heads); use one of {fits}"
                )
        if parallel.cp > 1:
            problems.append(
                f"{keys.setting('cp', parallel.cp)}: the 3D-HybridEngine does not support context "
                f"parallelism; set {keys.key('cp')}=1"
            )
        return problems

    @classmethod
    def build(cls, tp: int, pp: int, dp: int, gen_tp: int, num_kv_heads: int | None = None) -> GenerationPlan:
        """The plan for a training layout tp × pp × dp (world = tp·pp·dp) at generation TP `gen_tp`."""
        if dp < 1:
            raise LayoutError([f"dp={dp} must be ≥ 1"])
        return cls.for_layout(ParallelLayout(world_size=tp * pp * dp, tp=tp, pp=pp), gen_tp, num_kv_heads)

    @classmethod
    def for_layout(
        cls, layout: ParallelLayout, gen_tp: int, num_kv_heads: int | None = None, gen_ep: bool = False
    ) -> GenerationPlan:
        """The plan for an existing training layout; `num_kv_heads` (if given) must split over `gen_tp`."""
        return cls(layout, gen_tp, num_kv_heads, gen_ep)

    @property
    def stride(self) -> int:
        """s = t / t_g: training TP ranks per generation TP rank (and the stride of generation TP groups)."""
        return self.layout.tp // self.gen_tp

    @property
    def micro_dp_size(self) -> int:
        """d_g = p·t / t_g: generation replicas per training replica, and ranks per micro-DP group."""
        return self.layout.pp * self.stride

    @property
    def gen_dp_size(self) -> int:
        """Generation replicas in the world (world / t_g): the prompt batch is split this many ways."""
        return self.layout.world_size // self.gen_tp

    def gen_tp_rank(self, rank: int) -> int:
        """Which generation TP shard `rank` holds: training TP rank // s."""
        return self.layout.coordinates(rank).tp // self.stride

    def micro_dp_rank(self, rank: int) -> int:
        """`rank`'s index in its micro-DP group (PP stage major, then position in its run of s ranks)."""
        c = self.layout.coordinates(rank)
        return c.pp * self.stride + c.tp % self.stride

    def gen_dp_rank(self, rank: int) -> int:
        """Which generation replica `rank` belongs to, i.e. which prompt chunk it serves."""
        return self.layout.coordinates(rank).dp * self.micro_dp_size + self.micro_dp_rank(rank)

    def gen_tp_group(self, rank: int) -> list[int]:
        """The ranks of `rank`'s generation replica, in generation TP order."""
        c = self.layout.coordinates(rank)
        return [self._rank(j * self.stride + c.tp % self.stride, c.dp, c.pp) for j in range(self.gen_tp)]

    def micro_dp_group(self, rank: int) -> list[int]:
        """The d_g ranks of `rank`'s training replica holding the same generation shard, in micro-DP order."""
        c = self.layout.coordinates(rank)
        return [r for pp in range(self.layout.pp) for r in self._run(self.gen_tp_rank(rank), c.dp, pp)]

    def gather_group(self, rank: int) -> list[int]:
        """`rank`'s run of s consecutive ranks on its PP stage, whose training shards make one generation shard."""
        c = self.layout.coordinates(rank)
        return self._run(self.gen_tp_rank(rank), c.dp, c.pp)

    def shard_sources(self, rank: int, owner_stage: int) -> list[int]:
        """For a TP-sharded parameter held by PP stage `owner_stage`: the ranks whose training shards,
        concatenated in this order (per ParamKind, see sharding.py), are `rank`'s generation shard of it."""
        self._check_stage(owner_stage)
        return self._run(self.gen_tp_rank(rank), self.layout.coordinates(rank).dp, owner_stage)

    @cached_property
    def gen_tp_groups(self) -> list[list[int]]:
        """Every generation replica's ranks; entry i is replica i (= gen_dp_rank), in generation TP order."""
        s, layout = self.stride, self.layout
        return [
            [self._rank(j * s + i, dp, pp) for j in range(self.gen_tp)]
            for dp in range(layout.dp)
            for pp in range(layout.pp)
            for i in range(s)
        ]

    @cached_property
    def micro_dp_groups(self) -> list[list[int]]:
        """Every micro-DP group (training replica major, then generation TP rank), members in micro-DP order."""
        return [
            self.micro_dp_group(self._rank(g * self.stride, dp, 0))
            for dp in range(self.layout.dp)
            for g in range(self.gen_tp)
        ]

    @cached_property
    def gather_groups(self) -> list[list[int]]:
        """Every gather group (runs of s consecutive ranks), ordered by first rank."""
        layout = self.layout
        runs = [
            self._run(g, dp, pp)
            for pp in range(layout.pp)
            for dp in range(layout.dp)
            for g in range(self.gen_tp)
        ]
        return sorted(runs)

    def received_bytes(
        self, rank: int, param_bytes: int, kind: ParamKind | str, owner_stage: int | Iterable[int]
    ) -> int:
        """Bytes `rank` must receive to hold its generation shard of one parameter: what it needs less what
        it holds. `param_bytes` is the full (TP=1) tensor's size as megatron holds it (vocab padding rows
        included); `owner_stage` is the PP stage holding it, or several for a copy kept on more than one
        stage (tied embedding and output layer under PP)."""
        owners = {owner_stage} if isinstance(owner_stage, int) else set(owner_stage)
        for stage in owners:
            self._check_stage(stage)
        held = self.layout.coordinates(rank).pp in owners
        kind = ParamKind.of(kind)
        if not kind.tp_sharded:
            return 0 if held else param_bytes
        if param_bytes % self.layout.tp:
            raise ValueError(
                f"a {kind} parameter of {param_bytes} bytes does not split into tp={self.layout.tp} equal shards"
            )
        shard = param_bytes // self.layout.tp
        return shard * self.stride - (shard if held else 0)

    def training_experts(self, rank: int, num_experts: int) -> range:
        """The experts `rank` holds (a shard of) in each MoE layer of its stage."""
        per_rank = self._experts_per(num_experts, self.layout.ep, "actor.parallel.ep")
        k, _ = self.layout.expert_coordinates(rank)
        return range(k * per_rank, (k + 1) * per_rank)

    def engine_experts(self, rank: int, num_experts: int) -> range:
        """The experts `rank`'s engine holds: all of them (TP-sharded), or with gen_ep its whole block."""
        if not self.gen_ep:
            return range(num_experts)
        per_rank = self._experts_per(num_experts, self.gen_tp, "rollout.tp")
        j = self.gen_tp_rank(rank)
        return range(j * per_rank, (j + 1) * per_rank)

    def expert_received_bytes(
        self,
        rank: int,
        expert_bytes: int,
        expert: int,
        num_experts: int,
        kind: ParamKind | str,
        owner_stage: int,
    ) -> int:
        """Bytes `rank` must receive of one tensor of expert `expert` in one MoE layer held by PP stage
        `owner_stage`: its engine's part (the generation TP shard; with gen_ep the whole tensor when the
        expert is in its block, else nothing) less the training shard it holds. `expert_bytes` is the full
        (TP=1) tensor."""
        self._check_stage(owner_stage)
        kind = ParamKind.of(kind)
        if not kind.tp_sharded or expert_bytes % self.layout.tp:
            raise ValueError(
                f"an expert tensor of {expert_bytes} bytes and kind {kind} does not split into "
                f"tp={self.layout.tp} equal shards"
            )
        if expert not in self.engine_experts(rank, num_experts):
            return 0
        shard = expert_bytes // self.layout.tp
        holds = self.layout.coordinates(rank).pp == owner_stage and expert in self.training_experts(
            rank, num_experts
        )
        return (expert_bytes if self.gen_ep else shard * self.stride) - (shard if holds else 0)

    @staticmethod
    def _experts_per(num_experts: int, ways: int, key: str) -> int:
        if num_experts % ways:
            raise ValueError(f"{key}={ways} does not divide the model's {num_experts} experts")
        return num_experts // ways

    def floor_bytes(self, model_bytes: float) -> float:
        """Bytes each rank receives for an all-TP-sharded model of `model_bytes` spread evenly over the stages:
        (t·p − t_g)/(t_g·t·p)·M (see the module docstring for replicated tensors)."""
        t, p = self.layout.tp, self.layout.pp
        return model_bytes * (t * p - self.gen_tp) / (self.gen_tp * t * p)

    def naive_bytes(self, model_bytes: float) -> float:
        """Bytes each rank receives when every rank gathers the whole model from all t·p·d ranks, each holding
        a distinct 1/(t·p·d) of it (ZeRO-3 style, as DeepSpeed-Chat does): (t·p·d − 1)/(t·p·d)·M."""
        world = self.layout.world_size
        return model_bytes * (world - 1) / world

    def describe(self, model_bytes: float | None = None, max_ranks: int = 16) -> str:
        """A text table for logs: each rank's training coordinates and generation groups, and with
        `model_bytes` the per-rank floor and naive bytes."""
        layout = self.layout
        lines = [
            f"3D-HybridEngine plan: training {layout.describe()} ({layout.world_size} ranks) -> generation "
            f"tp{self.gen_tp} x dp{self.gen_dp_size}; micro-DP groups of {self.micro_dp_size}",
            f"{'rank':>5}  {'tp/pp/dp':<9} {'gen dp':>6} {'gen tp':>6}  {'gen-TP group':<16} {'micro-DP group':<20} gather group",
        ]
        for rank in range(min(layout.world_size, max_ranks)):
            c = layout.coordinates(rank)
            lines.append(
                f"{rank:>5}  {f'{c.tp}/{c.pp}/{c.dp}':<9} {self.gen_dp_rank(rank):>6} {self.gen_tp_rank(rank):>6}  "
                f"{_ranks(self.gen_tp_group(rank)):<16} {_ranks(self.micro_dp_group(rank)):<20} "
                f"{_ranks(self.gather_group(rank))}"
            )
        if layout.world_size > max_ranks:
            lines.append(f"  ... {layout.world_size - max_ranks} more ranks")
        if model_bytes is not None:
            floor, naive = self.floor_bytes(model_bytes), self.naive_bytes(model_bytes)
            lines.append(
                f"bytes received per rank, M={model_bytes / 2**30:.3f} GiB: floor {floor / 2**30:.3f} GiB "
                f"({floor / model_bytes:.4f} M), naive all-gather {naive / 2**30:.3f} GiB ({naive / model_bytes:.4f} M)"
            )
        return "\n".join(lines)

    def _rank(self, tp: int, dp: int, pp: int) -> int:
        return self.layout.rank(Coordinates(tp=tp, cp=0, dp=dp, pp=pp))

    def _run(self, gen_tp_rank: int, dp: int, pp: int) -> list[int]:
        s = self.stride
        return [self._rank(gen_tp_rank * s + i, dp, pp) for i in range(s)]

    def _check_stage(self, stage: int) -> None:
        if not 0 <= stage < self.layout.pp:
            raise ValueError(f"owner stage {stage} is not a PP stage of pp={self.layout.pp}")


def _ranks(ranks: list[int]) -> str:
    return "[" + ",".join(map(str, ranks)) + "]"
