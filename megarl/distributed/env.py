"""Where this process sits: rank, world size and rendezvous address, from torchrun, SLURM or arguments."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" | "slurm" | "explicit" | "single"


def _first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM nodelist such as 'node[03-05,07],gpu1' -> 'node03'."""
    match = re.match(r"([^\[,]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        return nodelist
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def detect_env(
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> DistEnv:
    """Explicit arguments win; then torchrun's variables; then SLURM's (srun); else a single process."""
    env = os.environ
    if rank is not None and world_size is not None:
        return DistEnv(
            rank,
            world_size,
            int(env.get("LOCAL_RANK", rank)),
            master_addr or env.get("MASTER_ADDR", "127.0.0.1"),
            int(master_port or env.get("MASTER_PORT", 29500)),
            "explicit",
        )
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
            "torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        job_id = int(env.get("SLURM_JOB_ID", "0"))
        return DistEnv(
            int(env["SLURM_PROCID"]),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", 0)),
            env.get("MASTER_ADDR") or _first_slurm_host(env.get("SLURM_JOB_NODELIST", "127.0.0.1")),
            int(env.get("MASTER_PORT", 20000 + job_id % 20000)),
            "slurm",
        )
    return DistEnv(0, 1, 0, "127.0.0.1", int(env.get("MASTER_PORT", 29500)), "single")
