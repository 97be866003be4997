"""The typed group handles (megarl.workers.groups) say exactly what their worker classes register: the
same methods, dispatch modes and parameters, the return type the mode collects, and an `_async` twin."""

import inspect

import pytest

from megarl.controller.dispatch import Dispatch
from megarl.controller.group import GroupHandle, WorkerGroup, as_handle, registered_methods
from megarl.controller.worker import Worker
from megarl.workers.actor import ActorWorker
from megarl.workers.critic import CriticWorker
from megarl.workers.groups import (
    ActorGroup,
    CriticGroup,
    MegatronGroup,
    RefGroup,
    RewardModelGroup,
    RewardTrainerGroup,
    RolloutGroup,
)
from megarl.workers.megatron_worker import MegatronWorker
from megarl.workers.reference import ReferenceWorker
from megarl.workers.reward import RewardModelWorker
from megarl.workers.reward_hf import HFRewardWorker
from megarl.workers.reward_trainer import RewardTrainerWorker
from megarl.workers.rollout_worker import RolloutWorker

pytestmark = pytest.mark.unit

HANDLES = [
    (Worker, GroupHandle),
    (MegatronWorker, MegatronGroup),
    (ActorWorker, ActorGroup),
    (ReferenceWorker, RefGroup),
    (CriticWorker, CriticGroup),
    (HFRewardWorker, RewardModelGroup),
    (RewardTrainerWorker, RewardTrainerGroup),
    (RolloutWorker, RolloutGroup),
]


def collected(mode: Dispatch, returns: str) -> str:
    """The group method's return annotation for a worker method returning `returns` under `mode`."""
    if mode == Dispatch.RANK_ZERO or (
        mode in (Dispatch.DP_COMPUTE, Dispatch.GEN_DP_COMPUTE) and returns == "Batch"
    ):
        return returns
    return f"list[{returns}]"


def parameters(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("worker_cls, handle", HANDLES, ids=lambda x: x.__name__)
def test_handle_matches_its_worker_class(worker_cls, handle):
    assert registered_methods(handle) == registered_methods(worker_cls)
    for name, mode in registered_methods(worker_cls).items():
        method, stub, future = (
            getattr(worker_cls, name),
            getattr(handle, name),
            getattr(handle, f"{name}_async"),
        )
        assert parameters(stub) == parameters(method), f"{handle.__name__}.{name}"
        assert parameters(future) == parameters(method), f"{handle.__name__}.{name}_async"
        returns = collected(mode, inspect.signature(method).return_annotation)
        assert inspect.signature(stub).return_annotation == returns, f"{handle.__name__}.{name}"
        assert inspect.signature(future).return_annotation == f"GroupFuture[{returns}]"


def test_every_reward_backend_answers_the_reward_model_handle():
    for worker_cls in (RewardModelWorker, HFRewardWorker, RewardTrainerWorker):
        methods = registered_methods(worker_cls)
        for name, mode in registered_methods(RewardModelGroup).items():
            assert methods[name] == mode
            assert parameters(getattr(worker_cls, name)) == parameters(getattr(RewardModelGroup, name))


class _Bound(WorkerGroup):
    def __init__(self, worker_cls: type) -> None:
        self.role, self.rank_infos = "critic", []
        self._expose(worker_cls, lambda name, mode: _Call())


class _Call:
    def __call__(self) -> None: ...

    def submit(self) -> None: ...


def test_as_handle_checks_the_bound_methods():
    group = _Bound(CriticWorker)
    assert as_handle(group, CriticGroup) is group
    with pytest.raises(TypeError, match=r"the critic group is no ActorGroup: it has no .*generate"):
        as_handle(group, ActorGroup)
