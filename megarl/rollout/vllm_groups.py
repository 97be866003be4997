"""vLLM's process groups, adapted for an engine that lives inside a training process (vllm 0.32.0 only).

vLLM in external-launcher mode builds its tensor-parallel groups from consecutive global ranks; the
3D-HybridEngine needs the generation plan's groups (strided, e.g. [0, 2] and [1, 3]; DESIGN §5).
`given_tp_groups` makes vLLM's parallel-state set-up use them. vLLM's engine teardown also destroys
torch's default process group, which the training side owns; `spare_default_process_group` makes
that teardown release only vLLM's own groups. Both reach into `vllm.distributed.parallel_state`, whose
internals change between releases, so this module refuses any other vLLM version.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch.distributed as dist

from megarl.distributed.backend import collective_timeout

PINNED_VLLM_VERSION = "0.32.0"


def check_vllm_version() -> None:
    """Raise if the installed vLLM is not the release these adapters were written against."""
    import vllm

    if vllm.__version__ != PINNED_VLLM_VERSION:
        raise RuntimeError(
            f"megarl.rollout.vllm_groups adapts vllm {PINNED_VLLM_VERSION} internals but vllm "
            f"{vllm.__version__} is installed; re-check vllm.distributed.parallel_state and update it"
        )


def consecutive_groups(world_size: int, tp: int) -> list[list[int]]:
    """vLLM's own TP groups: runs of `tp` consecutive ranks."""
    return [list(range(start, start + tp)) for start in range(0, world_size, tp)]


def check_tp_groups(groups: list[list[int]], world_size: int) -> int:
    """Validate that `groups` splits ranks 0..world_size-1 into equal-sized TP groups; return their size."""
    sizes = {len(g) for g in groups}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"generation TP groups {groups} must all have the same, non-zero size")
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(world_size)):
        raise ValueError(
            f"generation TP groups {groups} must hold every rank 0..{world_size - 1} exactly once"
        )
    return sizes.pop()


@contextlib.contextmanager
def given_tp_groups(groups: list[list[int]]) -> Iterator[None]:
    """While active, vLLM's parallel-state initialisation uses `groups` as its tensor-parallel groups.

    Every vLLM group that would be the consecutive TP partition (the TP group, and the expert-parallel
    groups of an MoE model when vLLM's own DP is 1) becomes `groups`; all other groups are untouched.
    The process groups vLLM creates meanwhile time out after trainer.worker_timeout_s. Use it around the `vllm.LLM(...)` call on every rank, with the same `groups` everywhere.
    """
    check_vllm_version()
    from vllm.distributed import parallel_state

    world_size = dist.get_world_size()
    tp = check_tp_groups(groups, world_size)
    default = consecutive_groups(world_size, tp)
    if parallel_state.model_parallel_is_initialized():
        current = parallel_state.get_tp_group().ranks
        mine = next(g for g in groups if dist.get_rank() in g)
        if current != mine:
            raise RuntimeError(
                f"vLLM's TP group {current} is already initialised (an engine was not closed); "
                f"cannot switch it to {mine}"
            )
    original = parallel_state.init_model_parallel_group

    def init_group(group_ranks: list[list[int]], *args, **kwargs):
        if [list(g) for g in group_ranks] == default:
            group_ranks = [list(g) for g in groups]
        return original(group_ranks, *args, **kwargs)

    new_group = dist.new_group

    def bounded_group(*args, **kwargs):  # vLLM passes no timeout: bound it by trainer.worker_timeout_s
        kwargs.setdefault("timeout", collective_timeout())
        return new_group(*args, **kwargs)

    parallel_state.init_model_parallel_group = init_group
    dist.new_group = bounded_group
    try:
        yield
    finally:
        parallel_state.init_model_parallel_group = original
        dist.new_group = new_group


def engine_tp_ranks() -> list[int]:
    """The global ranks of the TP group the vLLM engine in this process runs with."""
    from vllm.distributed import parallel_state

    return list(parallel_state.get_tp_group().ranks)


def release_engine_groups() -> None:
    """Destroy vLLM's process groups (model-parallel and its world group), never torch's default group."""
    from vllm.distributed import parallel_state

    gc.unfreeze()  # the engine gc.freeze()s its start-up objects; let them be collected again
    parallel_state.destroy_model_parallel()
    if parallel_state._WORLD is not None:
        parallel_state._WORLD.destroy()
    parallel_state._WORLD = None
    parallel_state._NODE_COUNT = None
    gc.collect()


def spare_default_process_group() -> None:
    """Make every vLLM engine shutdown in this process call `release_engine_groups` instead of vLLM's
    cleanup, which ends with `torch.distributed.destroy_process_group()` and so would take the training
    side's default group (and every Megatron group) with it. Idempotent."""
    check_vllm_version()
    from vllm.v1.engine import core

    core.cleanup_dist_env_and_memory = lambda *args, **kwargs: release_engine_groups()
