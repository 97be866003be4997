"""vLLM's process groups, adapted for an engine that lives inside a training process (vllm 0.32.0 only).

vLLM in external-launcher mode builds its tensor-parallel groups from consecutive global ranks; the
3D-HybridEngine needs the generation plan's groups (strided, e.g. [0, 2] and [1, 3]; DESIGN §5).
`given_tp_groups` makes vLLM's parallel-state set-up use them. vLLM's engine teardown also destroys
torch's default process group, which the training side owns; `spare_default_process_group` makes
that teardown release only vLLM's own groups. Both reach into `vllm.distributed.parallel_state`, whose
internals change between releases, so this module refuses any other vLLM version.

On CPU, vLLM's TP all-reduce goes through shared-memory segments named after the engine's init method,
which is the same ("env://") for every in-process engine: a segment left in /dev/shm by a killed run made
every later TP>1 engine on the machine fail with "create shm in SHMManager failed. errno: 17".
`given_tp_groups` therefore names them per engine (`megarl-<host>.<pid>.<n>-…`) and removes the ones
whose creating run is gone.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import socket
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from megarl.distributed.backend import collective_timeout

PINNED_VLLM_VERSION = "0.32.0"
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "megarl-"
_engines_started = itertools.count()


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
        with engine_shm_names():
            yield
    finally:
        parallel_state.init_model_parallel_group = original
        dist.new_group = new_group


def host_tag() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def shm_owner_gone(name: str, host: str) -> bool:
    """Whether /dev/shm entry `name` is a megarl engine segment of this host whose run (rank 0's pid) has
    ended. Segments of other hosts, or of another naming, are never claimed."""
    if not name.startswith(SHM_PREFIX) or "-cpushm_" not in name:
        return False
    tag, _, rest = name[len(SHM_PREFIX) :].partition(".")
    pid = rest.partition(".")[0]
    if tag != host or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stale_shm(root: Path = SHM_DIR) -> list[str]:
    """Unlink the engine segments left in `root` by runs that were killed; return their names."""
    host, removed = host_tag(), []
    for entry in root.glob(f"{SHM_PREFIX}*-cpushm_*") if root.is_dir() else ():
        if shm_owner_gone(entry.name, host):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed.append(entry.name)
    return removed


@contextlib.contextmanager
def engine_shm_names() -> Iterator[None]:
    """While active, vLLM's CPU shared-memory all-reduce segments are named for this engine: rank 0's
    host, pid and engine count, agreed over the default group (every rank calls this). No-op on GPU."""
    from megarl.distributed.platform import platform

    if platform().is_cuda:
        yield
        return
    from vllm.distributed.device_communicators import cpu_communicator

    remove_stale_shm()
    token = [f"{host_tag()}.{os.getpid()}.{next(_engines_started)}"]
    dist.broadcast_object_list(token, src=0)
    shm = cpu_communicator._CPUSHMDistributed
    original = shm.__dict__["make_group_name"]

    def make_group_name(communicator) -> str:
        ranks = "-".join(str(rank) for rank in communicator.ranks)
        return f"{SHM_PREFIX}{token[0]}-{communicator.unique_name}-[{ranks}]-cpushm"

    shm.make_group_name = staticmethod(make_group_name)
    try:
        yield
    finally:
        shm.make_group_name = original


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
