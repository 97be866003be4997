"""Process-group backend and device: nccl on GPUs, gloo (with the CPU shims) without."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from megarl.distributed.cpu_shims import apply_cpu_shims
from megarl.distributed.env import DistEnv, detect_env


def use_cuda() -> bool:
    return torch.cuda.is_available()


def backend_name() -> str:
    return "nccl" if use_cuda() else "gloo"


def device() -> torch.device:
    if use_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed(env: DistEnv | None = None, timeout_minutes: int = 30) -> DistEnv:
    """Initialise the default process group once (idempotent) and apply the CPU shims without CUDA."""
    env = env or detect_env()
    if use_cuda():
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    else:
        apply_cpu_shims()
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", env.master_addr)
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
        dist.init_process_group(
            backend=backend_name(),
            rank=env.rank,
            world_size=env.world_size,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    return env
