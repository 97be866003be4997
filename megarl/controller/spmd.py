"""SPMDWorkerGroup: the worker-group interface under torchrun/srun, without Ray (SPMD: every rank is
also the driver). The "spmd" backend of `megarl.controller.group.WorkerGroup`.

`SPMDWorkerGroup(None, worker_cls, role, init_kwargs)` builds the worker in this process;
`group.method(...)` splits the call exactly as the Ray group does, runs this rank's share, and
all-gathers the outputs so every rank returns the same collected result. `group.method_async(...)`
runs the call the same way and returns a completed future. A failure on any rank raises `WorkerError`
on every rank. Colocated roles are several workers in this process, shut down together.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist

from megarl.controller.dispatch import Dispatch, RankInfo, collect, split
from megarl.controller.group import WorkerGroup
from megarl.controller.rank_status import RANK_STATUS
from megarl.controller.worker import RemoteError, WorkerError
from megarl.distributed.backend import TIMEOUT_ENV, collective_timeout


class CompletedFuture:
    """The outcome of a call that has already run: `result()` returns it or raises its error."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class _LocalHost:
    """The workers of the roles that share this process; shut down once, in reverse build order."""

    def __init__(self, roles: dict[str, tuple[type, dict]]) -> None:
        self.workers: dict[str, Any] = {}
        for role, (cls, kwargs) in roles.items():
            self.workers[role] = cls(**kwargs)
        self.closed = False

    def shutdown(self) -> None:
        if not self.closed:
            self.closed = True
            for worker in reversed(self.workers.values()):
                worker.shutdown()


class _SPMDMethod:
    def __init__(self, host: _LocalHost, role: str, name: str, mode: Dispatch, rank_infos: list) -> None:
        self.host, self.role, self.name, self.mode, self.rank_infos = host, role, name, mode, rank_infos

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.host.closed:
            raise WorkerError(f"{self.role} group is shut down", self.role)
        calls, context = split(self.mode, args, kwargs, self.rank_infos)
        my_args, my_kwargs = calls[dist.get_rank()]
        RANK_STATUS.call(self.role, self.name)
        try:
            outcome = ("ok", self.host.workers[self.role].execute(self.name, my_args, my_kwargs, self.role))
        except RemoteError as e:
            if _peer_failure(e):  # the others are stuck or gone too: exchanging outcomes would wait again
                RANK_STATUS.returned()
                raise WorkerError(
                    f"{self.role}.{self.name} failed on rank {e.rank} on {e.host} (pid {e.pid}) in a "
                    f"collective: a peer rank died or did not arrive within "
                    f"{collective_timeout().total_seconds():g} s (trainer.worker_timeout_s): {e.error}",
                    self.role,
                    e.rank,
                    e.host,
                    e.pid,
                ) from None
            outcome = ("error", e)
        RANK_STATUS.returned()
        outcomes: list[Any] = [None] * len(self.rank_infos)
        try:
            dist.all_gather_object(outcomes, outcome)
        except Exception as e:  # a peer died, or did not arrive within the process group's timeout
            here = f"rank {dist.get_rank()} on {socket.gethostname()} (pid {os.getpid()})"
            raise WorkerError(
                f"{self.role}.{self.name}: {here} finished its part ({outcome[0]}) but could not collect the "
                f"other ranks' outcomes: a rank died, or did not arrive within {collective_timeout().total_seconds():g} "
                f"s (trainer.worker_timeout_s): {type(e).__name__}: {e}",
                self.role,
                dist.get_rank(),
                socket.gethostname(),
                os.getpid(),
            ) from None
        failed = [o[1] for o in outcomes if o[0] == "error"]
        if failed:
            first = failed[0]
            raise WorkerError(
                f"{self.role}.{self.name} failed on {len(failed)} rank(s); first: rank {first.rank} on "
                f"{first.host} (pid {first.pid}): {first.error}\n{first.trace}",
                self.role,
                first.rank,
                first.host,
                first.pid,
            )
        return collect(self.mode, [o[1] for o in outcomes], self.rank_infos, context)

    def submit(self, *args: Any, **kwargs: Any) -> CompletedFuture:
        try:
            return CompletedFuture(self(*args, **kwargs))
        except WorkerError as e:
            return CompletedFuture(error=e)


# How a collective fails when a peer is dead (gloo: the socket closes) or never arrives (the timeout)
_PEER_FAILURES = (
    "DistBackendError",
    "DistNetworkError",
    "Timed out waiting",
    "Connection reset by peer",
    "Connection closed by peer",
)


def _peer_failure(error: RemoteError) -> bool:
    return any(mark in error.error for mark in _PEER_FAILURES)


class SPMDWorkerGroup(WorkerGroup):
    """The ranks of one role under torchrun: this rank's worker is `group.worker`.

    The constructor has the Ray group's shape. `pool` is unused (the group is the torchrun world) and
    may be None. Every call is collective (there is no driver apart from the ranks), so
    `call_timeout_s` becomes the timeout of every process group the workers create (it must be given
    before the first worker of the process initialises torch.distributed); `start_timeout_s` is unused.
    """

    def __init__(
        self,
        pool: Any,
        worker_cls: type,
        role: str,
        init_kwargs: dict | None = None,
        call_timeout_s: float | None = None,
        start_timeout_s: float | None = None,
    ) -> None:
        if call_timeout_s is not None:
            os.environ[TIMEOUT_ENV] = str(call_timeout_s)
        self._bind(_LocalHost({role: (worker_cls, init_kwargs or {})}), worker_cls, role)

    @classmethod
    def colocated(
        cls,
        pool: Any,
        roles: dict[str, tuple[type, dict]],
        call_timeout_s: float | None = None,
        start_timeout_s: float | None = None,
    ) -> dict[str, SPMDWorkerGroup]:
        """Several roles ({role: (worker class, init kwargs)}) as workers of this process, built in
        order; `shutdown()` of any of the groups shuts all of them down."""
        if call_timeout_s is not None:
            os.environ[TIMEOUT_ENV] = str(call_timeout_s)
        host = _LocalHost(roles)
        views = {}
        for role, (worker_cls, _) in roles.items():
            view = cls.__new__(cls)
            view._bind(host, worker_cls, role)
            views[role] = view
        return views

    def _bind(self, host: _LocalHost, worker_cls: type, role: str) -> None:
        self._host = host
        self.role = role
        self.worker = host.workers[role]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.worker.rank_info())
        self.rank_infos: list[RankInfo] = gathered
        self._expose(worker_cls, lambda name, mode: _SPMDMethod(host, role, name, mode, self.rank_infos))

    @property
    def alive(self) -> bool:
        return not self._host.closed

    def shutdown(self) -> None:
        """Tear down this process's workers (every colocated role's) and their process groups."""
        self._host.shutdown()
