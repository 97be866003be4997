"""The WorkerGroup interface without processes: the factory, method binding, completed futures."""

import pytest

from megarl.controller.dispatch import Dispatch, register
from megarl.controller.group import WorkerGroup, make_worker_group, registered_methods
from megarl.controller.spmd import CompletedFuture
from megarl.controller.worker import WorkerError

pytestmark = pytest.mark.unit


class Probe:
    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> str:
        return "pong"

    @register(Dispatch.RANK_ZERO)
    def shutdown(self) -> None: ...

    def helper(self) -> None: ...


class _Method:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> str:
        return f"called {self.name}"

    def submit(self) -> CompletedFuture:
        return CompletedFuture(self())


class LocalGroup(WorkerGroup):
    def __init__(self, worker_cls: type) -> None:
        self.role, self.rank_infos = "probe", [None, None]
        self._expose(worker_cls, lambda name, mode: _Method(name))


def test_registered_methods_are_the_dispatch_marked_ones():
    assert registered_methods(Probe) == {"ping": Dispatch.ONE_TO_ALL, "shutdown": Dispatch.RANK_ZERO}


def test_a_method_that_would_hide_the_groups_own_api_is_refused():
    with pytest.raises(ValueError, match=r"Probe\.shutdown clashes with the worker group's own API"):
        LocalGroup(Probe)


def test_every_registered_method_gets_a_call_and_an_async_twin():
    class Pinger:
        ping = Probe.ping

    group = LocalGroup(Pinger)
    assert group.ping() == "called ping" and group.ping_async().result() == "called ping"
    assert group.world_size == 2 and not hasattr(group, "helper")


def test_completed_future_is_done_and_raises_its_error_at_result():
    assert CompletedFuture(3).done() and CompletedFuture(3).result() == 3
    failed = CompletedFuture(error=WorkerError("actor.update failed", "actor"))
    assert failed.done()
    with pytest.raises(WorkerError, match="actor.update failed"):
        failed.result()


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown worker-group backend 'mpi'; expected one of ray, spmd"):
        make_worker_group("mpi", None, Probe, "probe")
