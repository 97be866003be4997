"""RayWorkerGroup: one Ray actor per rank, called from the driver like one object (the "ray" backend
of `megarl.controller.group.WorkerGroup`; build it with `make_worker_group`).

    pool = ResourcePool([4])
    actor = RayWorkerGroup(pool, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
    out = actor.log_prob(batch)                       # split by dispatch mode, run, collect
    fut = actor.log_prob_async(batch)                 # overlap with another group; fut.result()

    groups = RayWorkerGroup.colocated(pool, {"actor": (ActorWorker, {"spec": actor_spec}),
                                             "ref": (ReferenceWorker, {"spec": ref_spec})})
    groups["ref"].ref_log_prob(batch)                 # both roles live in one process per rank

Every `@register(mode)` method of the worker class becomes a group method. A failure on any rank, or
a rank that does not answer within `call_timeout_s`, raises `WorkerError` and kills every actor of
the group, so no process is left behind.
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray import cloudpickle
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from megarl.controller import faults
from megarl.controller.dispatch import Dispatch, RankInfo, collect, split
from megarl.controller.group import WorkerGroup
from megarl.controller.resource_pool import Placement, ResourcePool
from megarl.controller.worker import RemoteError, WorkerError
from megarl.distributed.backend import TIMEOUT_ENV
from megarl.distributed.launch import free_port
from megarl.observe.worker_logs import log_file, quiet_known_warnings, redirect_output


class _RankHost:
    """The actor behind one rank: one worker object per colocated role, sharing this process.

    With `log_path`, the process's stdout and stderr go to that file first; `roles` arrive pickled so
    that what the workers' modules print on import lands there too. Roles are built in order; the first
    one initialises torch.distributed (the others find it up).
    """

    def __init__(self, roles: bytes, log_path: str | None) -> None:
        if log_path is not None:
            redirect_output(log_path)
        quiet_known_warnings()
        built: dict[str, tuple[type, dict]] = cloudpickle.loads(roles)
        self.workers = {role: cls(**kwargs) for role, (cls, kwargs) in built.items()}

    def describe(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "rank_info": {role: w.rank_info() for role, w in self.workers.items()},
        }

    def execute(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        return self.workers[role].execute(method, args, kwargs, role)

    def shutdown(self) -> None:
        for worker in reversed(self.workers.values()):
            worker.shutdown()


_RemoteHost = ray.remote(max_restarts=0, max_task_retries=0)(_RankHost)


@ray.remote(num_cpus=0)
def _free_port_on_node() -> int:
    return _free_port()


_ports_handed_out: set[int] = set()


def _free_port() -> int:
    """A port nobody listens on now (and not already given to another group by this driver)."""
    while True:
        port = free_port(host="")
        if port not in _ports_handed_out:
            _ports_handed_out.add(port)
            return port


def _master_address(first: Placement) -> tuple[str, int]:
    """Rank 0's node IP and a free port there (picked here when the driver is on that node)."""
    if first.node_ip == ray.util.get_node_ip_address():
        return first.node_ip, _free_port()
    strategy = PlacementGroupSchedulingStrategy(first.placement_group, first.bundle_index)
    return first.node_ip, ray.get(_free_port_on_node.options(scheduling_strategy=strategy).remote())


def _import_root(cls: type) -> str:
    """The sys.path entry that makes `cls`'s module importable (actors share this filesystem)."""
    module = sys.modules[cls.__module__]
    return str(Path(inspect.getfile(module)).resolve().parents[cls.__module__.count(".")])


# how long a rank's exception waits for news of a dead peer before it is reported as the cause (a
# failure whose peers stay blocked in a collective is reported this much later)
_DEAD_PEER_GRACE_S = 5.0


def _root_failure(pending: dict, rank: int, error: Exception) -> tuple[int, Exception]:
    """(rank, error) to blame: a rank's exception inside a collective (gloo's "connection reset by
    peer") is often the echo of a peer whose process died; when a still-pending rank turns out dead
    within a few seconds, that rank is the cause."""
    if not isinstance(getattr(error, "cause", None) or error, RemoteError) or not pending:
        return rank, error
    done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_DEAD_PEER_GRACE_S)
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as dead:
            return pending[ref], dead
        except (ray.exceptions.RayError, RemoteError):
            pass
    return rank, error


class _RankActors:
    """The actors of one group (or of several colocated role views), and their fate."""

    def __init__(
        self,
        pool: ResourcePool,
        roles: dict[str, tuple[type, dict]],
        start_timeout_s: float,
        call_timeout_s: float,
        log_dir: str | os.PathLike | None = None,
    ):
        self.pool = pool
        self.call_timeout_s = call_timeout_s
        self.names = ", ".join(roles)
        self.log_dir = log_dir
        self.error: str | None = None
        self.actors: list[Any] = []
        self.meta: list[dict[str, Any]] = []
        pool.attach()
        try:
            self._start(roles, start_timeout_s)
        except BaseException:
            self.kill()
            raise

    def _start(self, roles: dict[str, tuple[type, dict]], timeout_s: float) -> None:
        placements = self.pool.placements()
        addr, port = _master_address(placements[0])
        roots = [_import_root(ResourcePool), *(_import_root(cls) for cls, _ in roles.values())]
        python_path = os.pathsep.join(dict.fromkeys([*roots, os.environ.get("PYTHONPATH", "")]))
        pickled_roles = cloudpickle.dumps(roles)
        first_role = next(iter(roles))  # the process's log is named for it (colocated roles share it)
        for rank, p in enumerate(placements):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(len(placements)),
                "LOCAL_RANK": str(p.local_rank),
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": python_path.rstrip(os.pathsep),
                # a collective inside the group gives up when the driver would (trainer.worker_timeout_s)
                TIMEOUT_ENV: str(self.call_timeout_s),
            }
            if faults.ENV in os.environ:  # fault-injection tests
                env[faults.ENV] = os.environ[faults.ENV]
            log_path = None if self.log_dir is None else str(log_file(self.log_dir, first_role, rank))
            actor = _RemoteHost.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(p.placement_group, p.bundle_index),
                runtime_env={"env_vars": env},
                **self.pool.actor_resources(),
            ).remote(pickled_roles, log_path)
            self.actors.append(actor)
            self.meta.append(
                {"rank": rank, "host": p.node_ip, "node_ip": p.node_ip, "pid": 0, "log": log_path}
            )
        described = self.gather([a.describe.remote() for a in self.actors], self.names, "__init__", timeout_s)
        for rank, info in enumerate(described):
            self.meta[rank].update(info)

    def check_alive(self, role: str) -> None:
        if self.error is not None:
            raise WorkerError(f"{role} group is shut down ({self.error})", role)

    def gather(
        self, refs: list, role: str, method: str, timeout_s: float, started: float | None = None
    ) -> list:
        """Every rank's answer; on the first failure or at the deadline, kill all and raise."""
        deadline = (time.monotonic() if started is None else started) + timeout_s
        pending = {ref: rank for rank, ref in enumerate(refs)}
        outputs: list[Any] = [None] * len(refs)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self._raise_hang(role, method, sorted(pending.values()), timeout_s)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    outputs[rank] = ray.get(ref)
                except (ray.exceptions.RayError, RemoteError) as e:
                    self._raise_failure(role, method, *_root_failure(pending, rank, e))
        return outputs

    def _raise_failure(self, role: str, method: str, rank: int, error: Exception) -> None:
        cause = getattr(error, "cause", None) or error
        meta = self.meta[rank]
        host, pid = meta["host"], meta["pid"]
        if isinstance(cause, RemoteError):
            host, pid, detail = cause.host, cause.pid, f"{cause.error}\n{cause.trace}"
        else:
            detail = str(error)
        where = f"rank {rank} of {len(self.actors)} on {host} (pid {pid})"
        self.kill(f"{role}.{method} failed on {where}")
        raise WorkerError(
            f"{role}.{method} failed on {where}: {detail}{self.output_of([rank])}\n"
            f"all actors of the group were killed {self.gone()}",
            role,
            rank,
            host,
            pid,
        ) from None

    def _raise_hang(self, role: str, method: str, ranks: list[int], timeout_s: float) -> None:
        where = ", ".join(f"{r} ({self.meta[r]['host']} pid {self.meta[r]['pid']})" for r in ranks)
        self.kill(f"{role}.{method} timed out")
        raise WorkerError(
            f"{role}.{method}: rank(s) {where} did not answer within {timeout_s:g}s "
            f"(trainer.worker_timeout_s); all actors of the group were killed {self.gone()}{self.output_of(ranks)}",
            role,
            ranks[0],
            self.meta[ranks[0]]["host"],
            self.meta[ranks[0]]["pid"],
        )

    def output_of(self, ranks: list[int]) -> str:
        """Where the ranks' stdout and stderr went ("" when the group keeps no logs)."""
        logs = [self.meta[r]["log"] for r in ranks if self.meta[r]["log"]]
        return f"\n{'output' if len(logs) == 1 else 'outputs'}: {', '.join(logs)}" if logs else ""

    def gone(self, timeout_s: float = 10.0) -> str:
        """Wait (up to `timeout_s`) until the killed actors' processes on this node have exited; says
        which pids are gone, still running, or on other nodes (not checked from here)."""
        import psutil

        here = ray.util.get_node_ip_address()
        local = [m["pid"] for m in self.meta if m["pid"] and m["node_ip"] == here]
        remote = [f"{m['pid']} on {m['host']}" for m in self.meta if m["pid"] and m["node_ip"] != here]
        deadline = time.monotonic() + timeout_s
        alive = local
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _running(psutil, pid)]
        parts = (
            [f"pids {', '.join(str(p) for p in local if p not in alive)} gone"]
            if len(alive) < len(local)
            else []
        )
        if alive:
            parts.append(f"pids {', '.join(map(str, alive))} still running after {timeout_s:g}s")
        if remote:
            parts.append(f"pids {', '.join(remote)} not checked from this node")
        return f"({'; '.join(parts)})" if parts else ""

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Let the workers tear down their process groups, then end the processes."""
        if self.error is not None:  # already killed, and waited for, by the failure that ended it
            return
        if self.actors:
            try:
                ray.wait(
                    [a.shutdown.remote() for a in self.actors],
                    num_returns=len(self.actors),
                    timeout=timeout_s,
                )
            except ray.exceptions.RayError:
                pass
        self.kill("shut down")
        self.gone(timeout_s)  # this node's actor processes have exited before the driver goes on

    def kill(self, reason: str = "killed") -> None:
        if self.error is not None:
            return
        self.error = reason
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except ray.exceptions.RayError:
                pass
        self.pool.detach()

    def __del__(self) -> None:
        if getattr(self, "error", "") is None and ray.is_initialized():
            try:
                self.kill("garbage-collected")
            except Exception:
                pass


def _running(psutil, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class RayFuture:
    """A call already running on every rank; `result()` waits for it and collects the outputs."""

    def __init__(self, call: _GroupMethod, refs: list, context: Any) -> None:
        self._call, self._refs, self._context = call, refs, context
        self._started = time.monotonic()
        self._done = False
        self._value: Any = None

    def done(self) -> bool:
        return self._done or not ray.wait(self._refs, num_returns=len(self._refs), timeout=0)[1]

    def result(self) -> Any:
        """The collected result; raises WorkerError (after killing the group) on failure or timeout."""
        if not self._done:
            c = self._call
            outputs = c.actors.gather(self._refs, c.role, c.name, c.timeout_s, self._started)
            self._value = collect(c.mode, outputs, c.rank_infos, self._context)
            self._done = True
        return self._value


class _GroupMethod:
    """`group.<name>(...)`: split, one `execute` per rank, gather, collect (holds no group reference,
    so dropping the last view of a group ends its actors)."""

    def __init__(
        self, actors: _RankActors, role: str, name: str, mode: Dispatch, rank_infos: list, timeout_s: float
    ) -> None:
        self.actors, self.role, self.name, self.mode = actors, role, name, mode
        self.rank_infos, self.timeout_s = rank_infos, timeout_s

    def submit(self, *args: Any, **kwargs: Any) -> RayFuture:
        self.actors.check_alive(self.role)
        calls, context = split(self.mode, args, kwargs, self.rank_infos)
        refs = [
            actor.execute.remote(self.role, self.name, a, k)
            for actor, (a, k) in zip(self.actors.actors, calls)
        ]
        return RayFuture(self, refs, context)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.submit(*args, **kwargs).result()


class RayWorkerGroup(WorkerGroup):
    """The ranks of one role, as one object: `group.method(...)` and `group.method_async(...)`.

    `init_kwargs` go to `worker_cls(**init_kwargs)` on every rank. `start_timeout_s` bounds the
    workers' start (imports, process-group rendezvous); `call_timeout_s` bounds every call. With
    `log_dir`, each rank's process writes its stdout and stderr to `<log_dir>/<role>_rank<r>.log`
    (colocated roles: the first role's name) and a failure names that file.
    """

    def __init__(
        self,
        pool: ResourcePool,
        worker_cls: type,
        role: str,
        init_kwargs: dict | None = None,
        call_timeout_s: float = 300.0,
        start_timeout_s: float = 300.0,
        log_dir: str | os.PathLike | None = None,
    ) -> None:
        actors = _RankActors(
            pool, {role: (worker_cls, init_kwargs or {})}, start_timeout_s, call_timeout_s, log_dir
        )
        self._bind(actors, worker_cls, role, call_timeout_s)

    @classmethod
    def colocated(
        cls,
        pool: ResourcePool,
        roles: dict[str, tuple[type, dict]],
        call_timeout_s: float = 300.0,
        start_timeout_s: float = 300.0,
        log_dir: str | os.PathLike | None = None,
    ) -> dict[str, RayWorkerGroup]:
        """Several roles ({role: (worker class, init kwargs)}) in ONE process per rank (one
        torch.distributed world); a view per role.

        The first role initialises torch.distributed and megatron's layout. A failure in any role,
        or `shutdown()` of any view, ends the shared processes and so every view.
        """
        actors = _RankActors(pool, roles, start_timeout_s, call_timeout_s, log_dir)
        views = {}
        for role, (worker_cls, _) in roles.items():
            view = cls.__new__(cls)
            view._bind(actors, worker_cls, role, call_timeout_s)
            views[role] = view
        return views

    def _bind(self, actors: _RankActors, worker_cls: type, role: str, call_timeout_s: float) -> None:
        self._actors = actors
        self.role = role
        self.call_timeout_s = call_timeout_s
        self.rank_infos: list[RankInfo] = [m["rank_info"][role] for m in actors.meta]
        try:
            self._expose(
                worker_cls,
                lambda name, mode: _GroupMethod(actors, role, name, mode, self.rank_infos, call_timeout_s),
            )
        except ValueError as e:
            actors.kill("method name clashes")
            raise WorkerError(str(e), role) from None

    def free_port_on_rank0(self) -> tuple[str, int]:
        """(rank 0's node IP, a port free there now): where a store that rank 0 serves can listen,
        e.g. the weight bridge to a separate rollout pool (`join_bridge`)."""
        return _master_address(self._actors.pool.placements()[0])

    @property
    def processes(self) -> list[dict[str, Any]]:
        """rank, host, node_ip and pid of every rank's actor process."""
        return [{k: m[k] for k in ("rank", "host", "node_ip", "pid")} for m in self._actors.meta]

    @property
    def alive(self) -> bool:
        return self._actors.error is None

    @property
    def pool(self) -> ResourcePool:
        """The pool the group's processes run on."""
        return self._actors.pool

    def adopt(self, other: RayWorkerGroup) -> None:
        """Become `other` (a group of the same role started elsewhere, or at another layout): this object,
        held by whatever called it before, now reaches `other`'s processes. This group's own processes
        must already be shut down (a remap: megarl.trainer.remap)."""
        if other.role != self.role:
            raise ValueError(f"the {self.role} group cannot adopt the {other.role} group")
        vars(self).clear()
        vars(self).update(vars(other))

    def shutdown(self) -> None:
        """Tear down the workers and end their processes (for colocated views: every role's)."""
        self._actors.shutdown()
