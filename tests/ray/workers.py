"""Workers for the Ray worker-group tests; Ray actors import this module by name (tests.ray.workers)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from megarl.controller.dispatch import Dispatch, register
from megarl.controller.worker import Worker
from megarl.protocol import Batch


class ProbeWorker(Worker):
    @register(Dispatch.DP_COMPUTE)
    def double(self, batch: Batch) -> Batch:
        info = self.rank_info()
        n = len(batch)
        return Batch(
            tensors={
                "y": batch.tensors["x"] * 2,
                "dp_rank": torch.full((n,), info.dp_rank),
                "rank": torch.full((n,), info.rank),
            }
        )

    @register(Dispatch.ALL_TO_ALL)
    def world_sum(self, value: int) -> int:
        """All-reduce over the whole group: proves the ranks share one torch.distributed world."""
        t = torch.tensor([value])
        dist.all_reduce(t)
        return int(t.item())

    @register(Dispatch.ONE_TO_ALL)
    def fail_in_collective(self, bad_rank: int) -> int:
        """`bad_rank` raises while its peers wait in an all-reduce that will never complete."""
        if self.env.rank == bad_rank:
            raise ValueError(f"injected failure on rank {bad_rank}")
        t = torch.ones(1)
        dist.all_reduce(t)
        return int(t.item())

    @register(Dispatch.ONE_TO_ALL)
    def sleep_on(self, rank: int, seconds: float) -> int:
        if self.env.rank == rank:
            time.sleep(seconds)
        return self.env.rank


class PolicyRole(ProbeWorker):
    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict:
        return {"pid": os.getpid(), "world": id(dist.group.WORLD), "role": "policy"}


class RefRole(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict:
        return {"pid": os.getpid(), "world": id(dist.group.WORLD), "role": "ref"}

    @register(Dispatch.RANK_ZERO)
    def world_size_seen(self) -> int:
        t = torch.ones(1)
        dist.all_reduce(t)
        return int(t.item())


class FailsToStart(Worker):
    def __init__(self) -> None:
        raise FileNotFoundError("no checkpoint at /nonexistent")
