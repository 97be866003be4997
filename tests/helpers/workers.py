"""Small real workers for controller tests (used under Ray and under torchrun alike)."""

from __future__ import annotations

import time

import torch

from megarl.controller.dispatch import Dispatch, register
from megarl.controller.worker import Worker
from megarl.protocol import Batch


class EchoWorker(Worker):
    @register(Dispatch.DP_COMPUTE)
    def double(self, batch: Batch) -> Batch:
        n = len(batch)
        info = self.rank_info()
        return Batch(
            tensors={
                "y": batch["x"] * 2,
                "dp_rank": torch.full((n,), info.dp_rank),
                "rank": torch.full((n,), info.rank),
            }
        )

    @register(Dispatch.GEN_DP_COMPUTE)
    def gen_tag(self, batch: Batch) -> Batch:
        info = self.rank_info()
        return Batch(tensors={"x": batch["x"], "gen_dp_rank": torch.full((len(batch),), info.gen_dp_rank)})

    @register(Dispatch.RANK_ZERO)
    def rank(self) -> int:
        return self.env.rank

    @register(Dispatch.ALL_TO_ALL)
    def take(self, item: int) -> int:
        return item * 10 + self.env.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.env.rank == rank:
            raise ValueError(f"injected failure on rank {rank}")
        return self.env.rank

    @register(Dispatch.ONE_TO_ALL)
    def hang_on(self, rank: int, seconds: float) -> int:
        if self.env.rank == rank:
            time.sleep(seconds)
        return self.env.rank


class KeepWorldWorker(EchoWorker):
    """Counts its shutdowns instead of tearing down the process group, so a check can go on after."""

    shutdowns = 0

    def shutdown(self) -> None:
        KeepWorldWorker.shutdowns += 1
