"""What moves where when a separate rollout pool takes the actor's weights, shard to shard (pure).

The actor trains at t (TP) × p (PP) × d (DP) on its own world; the engines run on another pool of
`engine_ranks` ranks in consecutive TP groups of `engine_tp` (engine replica e = engine rank // engine_tp,
engine TP rank g = engine rank % engine_tp). Everything is in Hugging Face coordinates: each HF tensor
of a TP-sharded parameter (q, k and v of a fused QKV; gate and up of SwiGLU's fc1; the others whole) is
split into equal intervals along its shard dim (ROW: dim 1, the rest: dim 0) — training TP rank r holds
interval r of t, engine TP rank g reads interval g of engine_tp. The vocabulary is padded first
(Megatron's padded rows on the training side, vLLM's on the engine side; padding rows are never sent).

For engine rank (e, g) and one HF tensor the plan lists the slices it gets: its interval intersected
with each training TP rank's, each sent by that training rank
  - of training DP replica e % d (engine replicas spread over the DP replicas: no single broadcaster),
  - on the PP stage that owns the parameter (the first owner when several stages hold a tied copy),
and a replicated tensor (norms) whole from training TP rank g % t of that replica and stage.
The engine rank receives its region exactly once, so the bytes it receives equal `floor_bytes`: what
its engine shard holds. t and engine_tp need not divide each other: intervals intersect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from megarl.distributed.layout import Coordinates, LayoutError, ParallelLayout
from megarl.distributed.param_kind import ParamKind

# vLLM pads the vocabulary of its embedding and LM head to a multiple of this (its
# DEFAULT_VOCAB_PADDING_SIZE) before splitting it over TP ranks.
ENGINE_VOCAB_PADDING = 64


@dataclass(frozen=True)
class Slice:
    """Rows [start, stop) along the shard dim of one HF tensor (all of it for a replicated tensor),
    sent by training rank `train_rank` to engine rank `engine_rank` (ranks of their own worlds)."""

    train_rank: int
    engine_rank: int
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


def shard_dim(kind: ParamKind | str) -> int | None:
    """The HF dim a kind is split along (None: replicated)."""
    kind = ParamKind.of(kind)
    if kind is ParamKind.REPLICATED:
        return None
    return 1 if kind is ParamKind.ROW else 0


def padded_vocab(vocab: int, multiple: int) -> int:
    return -(-vocab // multiple) * multiple


@dataclass(frozen=True)
class PoolSyncPlan:
    """The slices each engine rank gets from each training rank. All sizes are of one HF tensor: its
    `length` along the shard dim (vocabulary rows for VOCAB) and, for VOCAB, the padded lengths that
    each side splits (`train_padded`: Megatron's padded vocabulary; the engine's is computed)."""

    train_layout: ParallelLayout
    engine_ranks: int
    engine_tp: int
    num_kv_heads: int | None = None  # when known, engine_tp must split the key/value heads

    def __post_init__(self) -> None:
        problems = PoolSyncPlan.check(self.train_layout, self.engine_ranks, self.engine_tp, self.num_kv_heads)
        if problems:
            raise LayoutError(problems)

    @staticmethod
    def check(
        train_layout: ParallelLayout, engine_ranks: int, engine_tp: int, num_kv_heads: int | None = None
    ) -> list[str]:
        """Every rule the pool layout must obey, as problem lines naming the config keys."""
        problems = []
        if engine_tp < 1:
            problems.append(f"rollout.tp={engine_tp} must be ≥ 1")
        elif engine_ranks < 1 or engine_ranks % engine_tp:
            problems.append(
                f"rollout.n_devices={engine_ranks} must be a positive multiple of rollout.tp={engine_tp} "
                "(the engines run in consecutive TP groups)"
            )
        elif num_kv_heads is not None and num_kv_heads % engine_tp:
            problems.append(
                f"rollout.tp={engine_tp} does not divide num_key_value_heads={num_kv_heads}; each engine "
                "TP rank must hold whole key/value heads"
            )
        if num_kv_heads is not None and num_kv_heads % train_layout.tp:
            problems.append(
                f"actor.parallel.tp={train_layout.tp} does not divide num_key_value_heads={num_kv_heads}: the "
                "pool weight sync sends each training rank's whole query groups; use an actor.parallel.tp "
                "that divides it"
            )
        if train_layout.cp > 1:
            problems.append(
                f"actor.parallel.cp={train_layout.cp}: the pool weight sync does not support context "
                "parallelism; set actor.parallel.cp=1"
            )
        return problems

    @property
    def engine_replicas(self) -> int:
        return self.engine_ranks // self.engine_tp

    def engine_coordinates(self, engine_rank: int) -> tuple[int, int]:
        """(engine replica, engine TP rank) of `engine_rank`."""
        if not 0 <= engine_rank < self.engine_ranks:
            raise ValueError(f"engine rank {engine_rank} is not one of {self.engine_ranks}")
        return divmod(engine_rank, self.engine_tp)

    def engine_region(self, engine_rank: int, kind: ParamKind | str, length: int) -> tuple[int, int]:
        """The interval [start, stop) along the shard dim that `engine_rank`'s engine reads (the whole
        tensor for a replicated kind)."""
        kind = ParamKind.of(kind)
        _, g = self.engine_coordinates(engine_rank)
        if not kind.tp_sharded:
            return 0, length
        padded = padded_vocab(length, ENGINE_VOCAB_PADDING) if kind is ParamKind.VOCAB else length
        return _interval(g, self.engine_tp, padded, length)

    def train_region(
        self, tp_rank: int, kind: ParamKind | str, length: int, train_padded: int | None = None
    ) -> tuple[int, int]:
        """The interval training TP rank `tp_rank` holds (padding rows cut off)."""
        kind = ParamKind.of(kind)
        if not kind.tp_sharded:
            return 0, length
        padded = length
        if kind is ParamKind.VOCAB:
            if train_padded is None or train_padded < length:
                raise ValueError(
                    f"a vocab tensor of {length} rows needs its padded row count (got {train_padded})"
                )
            padded = train_padded
        return _interval(tp_rank, self.train_layout.tp, padded, length)

    def source(self, engine_rank: int, owners: Iterable[int], tp_rank: int) -> int:
        """The training rank at TP rank `tp_rank` that serves `engine_rank` a parameter held by the PP
        stages `owners`: DP replica engine replica % dp, the first owning stage."""
        e, _ = self.engine_coordinates(engine_rank)
        stage = min(owners)
        if not 0 <= stage < self.train_layout.pp:
            raise ValueError(f"owner stage {stage} is not a PP stage of pp={self.train_layout.pp}")
        dp = e % self.train_layout.dp
        return self.train_layout.rank(Coordinates(tp=tp_rank, cp=0, dp=dp, pp=stage))

    def slices(
        self,
        engine_rank: int,
        kind: ParamKind | str,
        length: int,
        owners: Iterable[int] = (0,),
        train_padded: int | None = None,
    ) -> list[Slice]:
        """The slices `engine_rank` receives of one HF tensor, in row order."""
        kind = ParamKind.of(kind)
        owners = tuple(owners)
        start, stop = self.engine_region(engine_rank, kind, length)
        if not kind.tp_sharded:
            _, g = self.engine_coordinates(engine_rank)
            return [Slice(self.source(engine_rank, owners, g % self.train_layout.tp), engine_rank, 0, length)]
        out = []
        for r in range(self.train_layout.tp):
            lo, hi = self.train_region(r, kind, length, train_padded)
            lo, hi = max(lo, start), min(hi, stop)
            if lo < hi:
                out.append(Slice(self.source(engine_rank, owners, r), engine_rank, lo, hi))
        return out

    def sends(
        self,
        train_rank: int,
        kind: ParamKind | str,
        length: int,
        owners: Iterable[int] = (0,),
        train_padded: int | None = None,
    ) -> list[Slice]:
        """What `train_rank` sends of one HF tensor, to every engine rank (engine rank order)."""
        owners = tuple(owners)
        return [
            s
            for engine_rank in range(self.engine_ranks)
            for s in self.slices(engine_rank, kind, length, owners, train_padded)
            if s.train_rank == train_rank
        ]

    def floor_bytes(
        self, engine_rank: int, kind: ParamKind | str, shape: tuple[int, ...], itemsize: int
    ) -> int:
        """Bytes of one HF tensor of full shape `shape` that `engine_rank`'s engine shard holds: what it
        must receive (it holds nothing of the training pool's weights)."""
        dim = shard_dim(kind)
        if dim is None:
            return math.prod(shape) * itemsize
        start, stop = self.engine_region(engine_rank, kind, shape[dim])
        return (stop - start) * math.prod(shape) // shape[dim] * itemsize


def _interval(index: int, parts: int, padded: int, length: int) -> tuple[int, int]:
    """Interval `index` of `parts` equal ones of [0, padded), cut to [0, length)."""
    if padded % parts:
        raise ValueError(f"{padded} rows do not split into {parts} equal shards")
    size = padded // parts
    return min(index * size, length), min((index + 1) * size, length)
