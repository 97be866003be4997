"""The worker-group interface under torchrun/srun, without Ray (SPMD: every rank is also the driver).

`SPMDWorkerGroup(worker_cls, ...)` builds the worker in this process; `group.method(...)` splits the
call exactly as the Ray group does, runs this rank's share, and all-gathers the outputs so every rank
returns the same collected result. A failure on any rank raises `WorkerError` on every rank.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from megarl.controller.dispatch import collect, dispatch_mode_of, split
from megarl.controller.worker import RemoteError, WorkerError


class SPMDWorkerGroup:
    def __init__(self, worker_cls: type, role: str, init_kwargs: dict | None = None) -> None:
        self.role = role
        self.worker = worker_cls(**(init_kwargs or {}))
        self.ranks = [None] * dist.get_world_size()
        dist.all_gather_object(self.ranks, self.worker.rank_info())
        for name in dir(worker_cls):
            if not name.startswith("_") and dispatch_mode_of(getattr(worker_cls, name)) is not None:
                setattr(self, name, self._bind(name))

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def _bind(self, name: str):
        mode = dispatch_mode_of(getattr(type(self.worker), name))

        def call(*args: Any, **kwargs: Any) -> Any:
            calls, context = split(mode, args, kwargs, self.ranks)
            my_args, my_kwargs = calls[dist.get_rank()]
            try:
                outcome = ("ok", self.worker.execute(name, my_args, my_kwargs))
            except RemoteError as e:
                outcome = ("error", e)
            outcomes = [None] * self.world_size
            dist.all_gather_object(outcomes, outcome)
            failed = [o[1] for o in outcomes if o[0] == "error"]
            if failed:
                first = failed[0]
                raise WorkerError(
                    f"{self.role}.{name} failed on {len(failed)} rank(s); first: rank {first.rank} on "
                    f"{first.host} (pid {first.pid}): {first.error}\n{first.trace}",
                    self.role,
                    first.rank,
                    first.host,
                    first.pid,
                )
            return collect(mode, [o[1] for o in outcomes], self.ranks, context)

        call.__name__ = name
        return call

    def shutdown(self) -> None:
        self.worker.shutdown()
