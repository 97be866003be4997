"""Dispatch modes: how a driver call is split across a worker group's ranks and how results return.

Pure functions of the call arguments and each rank's `RankInfo`; both backends (Ray and SPMD) use them.

  ONE_TO_ALL   every rank gets the same arguments; results from every rank (a list)
  ALL_TO_ALL   argument i (a list of world_size items) goes to rank i; results from every rank
  RANK_ZERO    only rank 0 runs; its result
  DP_COMPUTE   Batch arguments are split by data-parallel rank (padded to a multiple of dp_size),
               replicated to the TP/PP/CP peers of each replica; results are taken from each
               replica's collecting rank, concatenated in DP order, padding removed
  GEN_DP_COMPUTE  the same over the generation layout: micro-DP replicas of the 3D-HybridEngine are
               extra data-parallel ranks (world / rollout_tp of them), collected from generation TP rank 0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "_megarl_dispatch"


class Dispatch(StrEnum):
    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE = "dp_compute"
    GEN_DP_COMPUTE = "gen_dp_compute"


@dataclass(frozen=True)
class RankInfo:
    rank: int
    dp_rank: int
    dp_size: int
    collect: bool  # TP rank 0 and CP rank 0 on the last PP stage: this rank's output is the replica's
    gen_dp_rank: int | None = None  # the same three under the generation layout (None: no rollout)
    gen_dp_size: int | None = None
    gen_collect: bool = False

    def replica(self, mode: Dispatch) -> tuple[int, int, bool]:
        """(replica index, replica count, collects?) under `mode`'s layout."""
        if mode == Dispatch.GEN_DP_COMPUTE:
            if self.gen_dp_rank is None:
                raise ValueError(
                    f"rank {self.rank} has no generation layout; gen_dp_compute needs a rollout tp"
                )
            assert self.gen_dp_size is not None  # set together with gen_dp_rank
            return self.gen_dp_rank, self.gen_dp_size, self.gen_collect
        return self.dp_rank, self.dp_size, self.collect


def register(mode: Dispatch) -> Callable[[F], F]:
    """Mark a worker method as callable from the driver with `mode` (the group handles of
    `megarl.workers.groups` repeat the mark, and a unit test holds the two equal)."""

    def mark(fn: F) -> F:
        setattr(fn, _MARK, Dispatch(mode))
        return fn

    return mark


def dispatch_mode_of(fn: Callable) -> Dispatch | None:
    return getattr(fn, _MARK, None)


def _is_batch(value: Any) -> bool:
    return all(hasattr(value, attr) for attr in ("chunk", "pad_to_multiple", "unpad")) and hasattr(
        type(value), "concat"
    )


def _check_ranks(mode: Dispatch, ranks: list[RankInfo]) -> int:
    replicas = [r.replica(mode) for r in ranks]
    dp_size = replicas[0][1]
    collectors = sorted(index for index, _, collects in replicas if collects)
    if collectors != list(range(dp_size)):
        raise ValueError(
            f"need exactly one collecting rank per DP replica (dp_size={dp_size}); got {collectors}"
        )
    return dp_size


def split(
    mode: Dispatch, args: tuple, kwargs: dict, ranks: list[RankInfo]
) -> tuple[list[tuple[tuple, dict]], Any]:
    """Per-rank (args, kwargs) for `mode`, plus the context `collect` needs."""
    world = len(ranks)
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        return [(args, kwargs)] * world, None
    if mode == Dispatch.ALL_TO_ALL:
        for value in (*args, *kwargs.values()):
            if not isinstance(value, list | tuple) or len(value) != world:
                raise ValueError(
                    f"all_to_all needs every argument to be a list of {world} items (one per rank)"
                )
        return [(tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in range(world)], None
    if mode in (Dispatch.DP_COMPUTE, Dispatch.GEN_DP_COMPUTE):
        dp_size = _check_ranks(mode, ranks)
        pad, parts_args, parts_kwargs = 0, [], {}
        for value in args:
            pad, parts = _split_by_dp(value, dp_size, pad)
            parts_args.append(parts)
        for key, value in kwargs.items():
            pad, parts_kwargs[key] = _split_by_dp(value, dp_size, pad)
        index = [r.replica(mode)[0] for r in ranks]
        calls = [(tuple(p[i] for p in parts_args), {k: p[i] for k, p in parts_kwargs.items()}) for i in index]
        batches = [v for v in (*args, *kwargs.values()) if _is_batch(v)]
        return calls, (pad, len(batches[0]) + pad) if pad else None
    raise ValueError(f"unknown dispatch mode {mode!r}")


def _split_by_dp(value: Any, dp_size: int, pad: int) -> tuple[int, list]:
    """Batches are padded and chunked; any other value is replicated to every replica."""
    if not _is_batch(value):
        return pad, [value] * dp_size
    padded, this_pad = value.pad_to_multiple(dp_size)
    if pad and this_pad != pad:
        raise ValueError("dp_compute arguments that are Batches must all have the same length")
    return this_pad, padded.chunk(dp_size)


def collect(mode: Dispatch, outputs: list, ranks: list[RankInfo], context: Any) -> Any:
    """The driver-side result of one call from every rank's output."""
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL):
        return outputs
    if mode == Dispatch.RANK_ZERO:
        return outputs[0]
    if mode in (Dispatch.DP_COMPUTE, Dispatch.GEN_DP_COMPUTE):
        replicas = [r.replica(mode) for r in ranks]
        per_replica = sorted(
            ((index, out) for (index, _, collects), out in zip(replicas, outputs) if collects),
            key=lambda x: x[0],
        )
        parts = [out for _, out in per_replica]
        if not parts or not _is_batch(parts[0]):
            return parts
        merged = type(parts[0]).concat(parts)
        if not context:
            return merged
        pad, padded_rows = context
        # an output may hold several rows per input row (generate: n samples per prompt, adjacent)
        return merged.unpad(pad * len(merged) // padded_rows)
    raise ValueError(f"unknown dispatch mode {mode!r}")
