"""Initialise torch.distributed on this process's platform: nccl on GPUs, gloo (with the CPU shims) without."""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from megarl.distributed.cpu_shims import apply_cpu_shims
from megarl.distributed.env import DistEnv, detect_env
from megarl.distributed.platform import platform


def init_distributed(env: DistEnv | None = None, timeout_minutes: int = 30) -> DistEnv:
    """Initialise the default process group once (idempotent) and apply the CPU shims without CUDA."""
    env = env or detect_env()
    platform().bind(env.local_rank)
    apply_cpu_shims()
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", env.master_addr)
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
        dist.init_process_group(
            backend=platform().backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    return env
