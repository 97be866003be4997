"""MEGARL_FAULT: the grammar, per-rank call counting, and what each kind does (kill/hang are checked by
the multi-process tests)."""

import pytest

from megarl.controller import faults
from megarl.controller.faults import Fault, FaultSpecError, InjectedFault, parse

pytestmark = pytest.mark.unit


@pytest.fixture
def fault_env(monkeypatch):
    faults.reset()

    def set_env(text: str) -> None:
        monkeypatch.setenv(faults.ENV, text)

    yield set_env
    faults.reset()


def test_parses_every_part_of_the_grammar():
    assert parse(
        "kill@actor.update#2/1; hang@actor.generate#1/1 ;nan@actor.update#2-3;raise@critic.values"
    ) == [
        Fault("kill", "actor.update", 2, 2, 1),
        Fault("hang", "actor.generate", 1, 1, 1),
        Fault("nan", "actor.update", 2, 3, None),
        Fault("raise", "critic.values", 1, None, None),
    ]
    assert parse("kill@actor.save_checkpoint:model_written#2/1") == [
        Fault("kill", "actor.save_checkpoint:model_written", 2, 2, 1)
    ]
    assert parse("hang@actor.generate/0") == [Fault("hang", "actor.generate", 1, None, 0)]
    assert parse("") == [] and parse(" ; ") == []


@pytest.mark.parametrize(
    "spec, says",
    [
        ("explode@actor.update", "unknown kind 'explode'"),
        ("kill@update", "expected KIND@ROLE.METHOD"),
        ("kill@actor.update#0", "calls count from 1"),
        ("kill@actor.update#3-2", "N ≤ M"),
        ("kill@actor.update#x", "expected KIND@ROLE.METHOD"),
        ("nan@actor.save:written", "not a point"),
    ],
)
def test_bad_specs_name_the_spec_and_the_grammar(spec, says):
    with pytest.raises(FaultSpecError, match=says) as e:
        parse(f"kill@actor.update;{spec}")
    assert repr(spec) in str(e.value) and "kill@actor.update#2/1" in str(e.value)


def test_calls_are_counted_per_target_and_rank(fault_env):
    fault_env("raise@actor.update#2/1")
    faults.on_call("actor", "update", 0)
    faults.on_call("actor", "update", 0)  # rank 0's 2nd call: not the target rank
    faults.on_call("actor", "update", 1)
    faults.on_call("actor", "log_prob", 1)  # another method does not advance update's count
    with pytest.raises(InjectedFault, match="actor.update call 2 on rank 1"):
        faults.on_call("actor", "update", 1)
    faults.on_call("actor", "update", 1)  # the 3rd call is outside #2


def test_named_points_count_apart_from_their_method(fault_env):
    fault_env("raise@actor.save_checkpoint:model_written#2")
    faults.on_call("actor", "save_checkpoint", 0)
    faults.point("actor", "save_checkpoint:model_written", 0)
    faults.on_call("actor", "save_checkpoint", 0)
    with pytest.raises(InjectedFault, match="save_checkpoint:model_written call 2 on rank 0"):
        faults.point("actor", "save_checkpoint:model_written", 0)


def test_nan_poisons_the_calls_in_its_range_on_every_rank(fault_env):
    fault_env("nan@actor.update#2-3")
    seen = []
    for _ in range(4):
        faults.on_call("actor", "update", 0)
        faults.on_call("actor", "update", 1)
        seen.append((faults.poisoned("actor", "update", 0), faults.poisoned("actor", "update", 1)))
    assert seen == [(False, False), (True, True), (True, True), (False, False)]
    assert not faults.poisoned("critic", "update", 0)


def test_no_env_means_no_fault_and_no_counting(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()
    faults.on_call("actor", "update", 0)
    assert not faults.poisoned("actor", "update", 0) and not faults._calls


def test_a_nan_call_computes_a_nan_loss_and_leaves_the_weights_and_later_calls_clean(fault_env):
    import torch

    fault_env("nan@actor.update#2/1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    weights = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(3, 4)
    seen = []
    for rank in (1, 0, 0, 1, 1):  # rank 1's calls 1, 2, 3; rank 0's 1, 2
        faults.on_call("actor", "update", rank)
        with faults.nan_forward("actor", "update", rank):
            model.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            with torch.no_grad():
                inference = model(x)  # outputs outside any backward stay as they are
        norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
        seen.append((loss.isnan().item(), norm.isnan().item(), inference.isnan().any().item()))
    nan, clean = (True, True, False), (False, False, False)
    assert seen == [clean, clean, clean, nan, clean]
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
