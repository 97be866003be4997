"""The WorkerGroup interface, the same under Ray and under torchrun/srun, and the factory the trainer calls.

    actor = make_worker_group("ray", pool, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
    out = actor.log_prob(batch)                 # split by the method's dispatch mode, run, collect
    fut = actor.log_prob_async(batch)           # fut.done(), fut.result()
    groups = make_colocated_groups("ray", pool, {"actor": (ActorWorker, kw), "ref": (ReferenceWorker, kw2)})
    groups["ref"].ref_log_prob(batch)           # both roles live in one process per rank

Every `@register(mode)` method `m` of the worker class becomes `group.m(...)` (the collected result)
and `group.m_async(...)` (a `GroupFuture`). A group has `role`, `world_size`, `rank_infos` (one
`RankInfo` per rank, what dispatch splits by), `shutdown()`, and is a context manager.

The methods are bound at run time, so code that calls them sees the group through its role's typed
handle (`GroupHandle` here; `ActorGroup`, `CriticGroup`, ... in `megarl.workers.groups`):

    actor = as_handle(make_worker_group("ray", pool, ActorWorker, "actor", kw), ActorGroup)
    rollouts: Batch = actor.generate(prompts)   # a type checker and an IDE follow this into ActorWorker

Backends: "ray" (`RayWorkerGroup`, one Ray actor per rank on a `ResourcePool`) and "spmd"
(`SPMDWorkerGroup`, every torchrun rank is also the driver; the pool is unused and may be None, and an
`_async` call has already run when it returns: its future is complete).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from megarl.controller.dispatch import Dispatch, RankInfo, dispatch_mode_of, register

Backend = Literal["ray", "spmd"]
BACKENDS = ("ray", "spmd")

T_co = TypeVar("T_co", covariant=True)


class GroupFuture(Protocol[T_co]):
    """A group call in flight (Ray) or already run (SPMD)."""

    def done(self) -> bool: ...

    def result(self) -> T_co:
        """The collected result; raises the call's WorkerError."""
        ...


@runtime_checkable
class GroupHandle(Protocol):
    """The typed view of any role's group: what every `Worker` answers. Each stub is the group method
    of the worker method of the same name, under the same `@register` mode, returning what that mode
    collects (ONE_TO_ALL: one item per rank; DP_COMPUTE: the Batch, or one item per DP replica)."""

    role: str
    rank_infos: list[RankInfo]

    @property
    def world_size(self) -> int: ...

    def shutdown(self) -> None: ...

    @register(Dispatch.ONE_TO_ALL)
    def coordinates(self) -> list[dict[str, Any]]: ...
    def coordinates_async(self) -> GroupFuture[list[dict[str, Any]]]: ...


H = TypeVar("H", bound=GroupHandle)


class _Method(Protocol):
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def submit(self, *args: Any, **kwargs: Any) -> GroupFuture: ...


def registered_methods(worker_cls: type) -> dict[str, Dispatch]:
    """{name: dispatch mode} of the worker class's driver-callable methods."""
    methods = {}
    for name in dir(worker_cls):
        mode = None if name.startswith("_") else dispatch_mode_of(getattr(worker_cls, name))
        if mode is not None:
            methods[name] = mode
    return methods


class WorkerGroup:
    """The ranks of one role as one object; the base of both backends."""

    role: str
    rank_infos: list[RankInfo]

    @property
    def world_size(self) -> int:
        return len(self.rank_infos)

    def shutdown(self) -> None:
        """Tear down the workers (for colocated groups: every role of the shared processes)."""
        raise NotImplementedError

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _expose(self, worker_cls: type, method: Callable[[str, Dispatch], _Method]) -> None:
        """Bind `name` and `name_async` for every registered method; raises ValueError on a name that
        would hide the group's own API."""
        reserved = set(dir(type(self))) | set(vars(self))
        for name, mode in registered_methods(worker_cls).items():
            if name in reserved or f"{name}_async" in reserved:
                raise ValueError(
                    f"{worker_cls.__name__}.{name} clashes with the worker group's own API; rename it"
                )
            bound = method(name, mode)
            setattr(self, name, bound)
            setattr(self, f"{name}_async", bound.submit)


def as_handle(group: WorkerGroup, handle: type[H]) -> H:
    """`group` as its role's typed handle; raises TypeError when its worker class lacks a method of it."""
    if not isinstance(group, handle):
        missing = sorted(name for name in registered_methods(handle) if not hasattr(group, name))
        raise TypeError(f"the {group.role} group is no {handle.__name__}: it has no {', '.join(missing)}")
    return group


def make_worker_group(
    backend: Backend, pool: Any, cls: type, role: str, kwargs: dict | None = None, **options: Any
) -> WorkerGroup:
    """One role's worker group: `cls(**kwargs)` on every rank of `pool` ("ray": a ResourcePool;
    "spmd": the torchrun world, pool may be None). `options` go to the backend: call_timeout_s (Ray:
    the driver's deadline per call; both: every process group's collective timeout) and start_timeout_s."""
    return make_colocated_groups(backend, pool, {role: (cls, kwargs or {})}, **options)[role]


def make_colocated_groups(
    backend: Backend, pool: Any, roles: dict[str, tuple[type, dict]], **options: Any
) -> Mapping[str, WorkerGroup]:
    """Several roles in ONE process per rank (one torch.distributed world), {role: group}. Roles are
    built in order; the first initialises torch.distributed and megatron's layout. A failure in any
    role, or `shutdown()` of any of the groups, ends the shared processes and so every group."""
    if backend == "ray":
        from megarl.controller.worker_group import RayWorkerGroup

        return RayWorkerGroup.colocated(pool, roles, **options)
    if backend == "spmd":
        from megarl.controller.spmd import SPMDWorkerGroup

        return SPMDWorkerGroup.colocated(pool, roles, **options)
    raise ValueError(f"unknown worker-group backend {backend!r}; expected one of {', '.join(BACKENDS)}")
