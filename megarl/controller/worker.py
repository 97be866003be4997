"""Worker: the base class of every role's per-rank worker, the same under Ray and under torchrun.

A worker joins the group's torch.distributed world from the environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT — set by the Ray worker group, torchrun or srun), optionally
initialises megatron's parallel state for its layout, and answers `rank_info()` so the driver can
dispatch. Methods marked with `@register(mode)` are what the driver calls.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import Any

from megarl.controller import faults
from megarl.controller.dispatch import Dispatch, RankInfo, register
from megarl.distributed.backend import init_distributed
from megarl.distributed.env import detect_env
from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.layout import ParallelLayout
from megarl.errors import MegarlError
from megarl.observe.profiling import RANK_PROFILER


class RemoteError(MegarlError, RuntimeError):
    """An exception raised inside a worker, carrying where it happened and the traceback text."""

    def __init__(self, rank: int, host: str, pid: int, error: str, trace: str) -> None:
        self.rank, self.host, self.pid, self.error, self.trace = rank, host, pid, error, trace
        super().__init__(f"rank {rank} on {host} (pid {pid}): {error}\n{trace}")

    def __reduce__(self):
        return RemoteError, (self.rank, self.host, self.pid, self.error, self.trace)


class WorkerError(MegarlError, RuntimeError):
    """A dispatched call (or the start of a group) failed or hung on some rank; raised in the driver."""

    def __init__(self, message: str, role: str, rank: int | None = None, host: str = "", pid: int = 0):
        self.role, self.rank, self.host, self.pid = role, rank, host, pid
        super().__init__(message)


class Worker:
    def __init__(self, layout_kwargs: dict | None = None, rollout_tp: int | None = None) -> None:
        self.rollout_tp = rollout_tp  # generation TP of a colocated rollout engine (None: no rollout)
        self.env = init_distributed(detect_env())
        self.layout = ParallelLayout(world_size=self.env.world_size, **(layout_kwargs or {}))
        # Colocated roles share one process and one layout: only the first initialises megatron.
        if layout_kwargs is not None and ParallelLayout.active() != self.layout:
            self.layout.initialize()

    def rank_info(self) -> RankInfo:
        c = self.layout.coordinates(self.env.rank)
        last_stage = c.pp == self.layout.pp - 1
        gen: dict[str, Any] = {}
        if self.rollout_tp is not None:
            plan = self.generation_plan()
            gen = {
                "gen_dp_rank": plan.gen_dp_rank(self.env.rank),
                "gen_dp_size": plan.gen_dp_size,
                "gen_collect": plan.gen_tp_rank(self.env.rank) == 0,
            }
        return RankInfo(
            rank=self.env.rank,
            dp_rank=c.dp,
            dp_size=self.layout.dp,
            collect=last_stage and c.tp == 0 and c.cp == 0,
            **gen,
        )

    def generation_plan(self):
        """The layout of the colocated rollout engine over this world (which ranks form a generation
        replica): the 3D-HybridEngine's plan of the training layout."""
        return GenerationPlan.for_layout(self.layout, self.rollout_tp)

    @register(Dispatch.ONE_TO_ALL)
    def coordinates(self) -> dict[str, Any]:
        c = self.layout.coordinates(self.env.rank)
        return {
            "rank": self.env.rank,
            "world_size": self.env.world_size,
            "tp": c.tp,
            "pp": c.pp,
            "dp": c.dp,
            "cp": c.cp,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def execute(self, method_name: str, args: tuple, kwargs: dict, role: str | None = None) -> Any:
        """Run one dispatched call of the group `role`; an exception comes back as a RemoteError naming
        this rank. While a step is profiled (`megarl.observe.profiling`), the call's seconds are recorded."""
        role = role or str(getattr(self, "role", type(self).__name__))
        try:
            faults.on_call(role, method_name, self.env.rank)  # MEGARL_FAULT (tests of failures)
            with RANK_PROFILER.timed(role, method_name), faults.nan_forward(role, method_name, self.env.rank):
                return getattr(self, method_name)(*args, **kwargs)
        except Exception as e:
            raise RemoteError(
                self.env.rank,
                socket.gethostname(),
                os.getpid(),
                f"{type(e).__name__}: {e}",
                traceback.format_exc(),
            ) from None

    def shutdown(self) -> None:
        import torch.distributed as dist

        if ParallelLayout.active() is not None:
            ParallelLayout.destroy()
        if dist.is_initialized():
            dist.destroy_process_group()
