"""Initialise torch.distributed on this process's platform: nccl on GPUs, gloo (with the CPU shims) without.

Every process group of a worker (the default one here, megatron's in `ParallelLayout.initialize`) waits
at most `collective_timeout()` in a collective: `MEGARL_WORKER_TIMEOUT_S` seconds, which the worker
groups set from `trainer.worker_timeout_s` before their workers start (default 30 min, NCCL's). A rank
that never arrives then makes the others raise instead of waiting forever.

Rank 0 serves the rendezvous store on MASTER_ADDR only (megarl.distributed.store); under torchrun the
ranks are clients of torchrun's store.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from megarl.distributed.cpu_shims import apply_cpu_shims
from megarl.distributed.env import DistEnv, detect_env
from megarl.distributed.platform import platform
from megarl.distributed.store import tcp_store

TIMEOUT_ENV = "MEGARL_WORKER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0


def collective_timeout() -> datetime.timedelta:
    """How long one collective of this process may wait for its peers."""
    return datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))


def init_distributed(env: DistEnv | None = None) -> DistEnv:
    """Initialise the default process group once (idempotent); without CUDA apply the CPU shims and
    keep freed host memory for reuse (`Platform.reuse_freed_host_memory`)."""
    env = env or detect_env()
    platform().bind(env.local_rank)
    apply_cpu_shims()
    platform().reuse_freed_host_memory()
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", env.master_addr)
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
        store = None  # under torchrun: a client of torchrun's store (env://)
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            store = tcp_store(
                env.master_addr, env.master_port, env.world_size, env.rank == 0, collective_timeout()
            )
        dist.init_process_group(
            backend=platform().backend,
            store=store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=collective_timeout(),
        )
    return env
