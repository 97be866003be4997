"""Profiling of chosen steps: per-call timing on a rank, the chrome trace, and the driver's file layout."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from megarl.controller.dispatch import Dispatch, register
from megarl.controller.worker import Worker
from megarl.observe.profiling import RankProfiler, StepProfiler, merge_ranks, step_dir, trace_name

pytestmark = pytest.mark.unit


def test_rank_profiler_times_each_call_and_writes_a_chrome_trace(tmp_path):
    profiler = RankProfiler()
    trace = step_dir(tmp_path, 3) / trace_name("actor", 0)
    assert profiler.start("actor", trace) and not profiler.start("critic")  # the critic joins
    with profiler.timed("actor", "update_actor"):
        torch.randn(64, 64) @ torch.randn(64, 64)
    for _ in range(2):
        with profiler.timed("ref", "ref_log_prob"):
            pass
    with profiler.timed("actor", "stop_profile"):
        pass
    assert profiler.stop("critic") is None and profiler.active  # only the role that started it stops it
    seconds = profiler.stop("actor")
    assert sorted(seconds) == ["actor.update_actor", "ref.ref_log_prob"] and seconds["actor.update_actor"] > 0
    assert trace == tmp_path / "profile" / "step_3" / "rank_0.json"
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("aten::mm" in e.get("name", "") for e in events)
    with profiler.timed("actor", "update_actor"):  # no profile running: nothing recorded
        pass
    assert not profiler.active and profiler.stop("actor") is None


class TinyWorker(Worker):
    role = "critic"

    @register(Dispatch.ONE_TO_ALL)
    def values(self, n: int) -> int:
        return n + 1


def test_worker_execute_times_dispatched_calls_only_while_profiling(monkeypatch):
    from megarl.controller import worker as worker_module

    profiler = RankProfiler()
    monkeypatch.setattr(worker_module, "RANK_PROFILER", profiler)
    w = object.__new__(TinyWorker)  # no torch.distributed: execute needs only the rank
    w.env = SimpleNamespace(rank=1)
    assert w.execute("values", (1,), {}) == 2
    profiler.start("critic")
    assert w.execute("values", (2,), {}) == 3 and w.execute("values", (3,), {}) == 4
    assert list(profiler.stop("critic")) == ["critic.values"]
    assert trace_name("critic", 1) == "critic_rank_1.json"


class FakeGroup:
    """A worker group whose `stop_profile` returns what MegatronWorker's does on each of its ranks."""

    def __init__(self, per_rank: list[dict[str, float]]) -> None:
        self.per_rank, self.calls = per_rank, []

    def start_profile(self, step, out_dir, ranks):
        self.calls.append(("start", step, out_dir, ranks))

    def stop_profile(self):
        self.calls.append(("stop",))
        return [{rank: times} for rank, times in enumerate(self.per_rank)]


def test_step_profiler_writes_every_ranks_call_times_for_profiled_steps_only(tmp_path):
    actor = FakeGroup([{"actor.generate": 4.0, "ref.ref_log_prob": 1.0}, {"actor.generate": 6.5}])
    critic = FakeGroup([{}, {}])  # torchrun: the actor's profile covered the critic's process
    profiler = StepProfiler(
        tmp_path, steps=[2], ranks=[0], groups={"actor": actor, "critic": critic, "ref": None}, writer=True
    )
    with profiler.step(1) as out:
        assert out is None
    assert actor.calls == [] and not (tmp_path / "profile").exists()
    with profiler.step(2) as out:
        assert actor.calls == [("start", 2, str(tmp_path / "profile" / "step_2"), [0])]
    assert actor.calls[-1] == ("stop",) and critic.calls[-1] == ("stop",)
    record = json.loads((out / "stage_times.json").read_text())
    assert record["step"] == 2
    assert record["ranks"] == {
        "actor": {"0": {"actor.generate": 4.0, "ref.ref_log_prob": 1.0}, "1": {"actor.generate": 6.5}}
    }
    assert record["spread"]["actor"]["actor.generate"] == {
        "slowest_rank": 1,
        "slowest_s": 6.5,
        "fastest_rank": 0,
        "fastest_s": 4.0,
    }
    assert merge_ranks([{1: {"a": 1.0}}, {0: {"a": 2.0}}]) == {0: {"a": 2.0}, 1: {"a": 1.0}}
