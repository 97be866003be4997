"""The step graph: ordering, checking at build time, editing, timing."""

from __future__ import annotations

import pytest
import torch

from megarl.protocol import Batch
from megarl.trainer.dataflow import Dataflow, DataflowError, Stage, StepContext


def _stage(name, reads=(), writes=(), value=1.0, log=None):
    def fn(ctx, batch):
        if log is not None:
            log.append(name)
        return {w: torch.full((len(batch),), value) for w in writes}

    return Stage(name, fn, reads=tuple(reads), writes=tuple(writes))


def _prompts(n=3):
    return Batch({"prompts": torch.zeros(n, 2, dtype=torch.long)})


def test_stages_run_in_order_and_merge_their_columns_with_timings():
    log = []
    flow = Dataflow(
        [_stage("a", ["prompts"], ["x"], log=log), _stage("b", ["x"], ["y"], 2.0, log=log)],
        inputs=["prompts"],
    )
    ctx = StepContext(step=1)
    out = flow.run(_prompts(), ctx)
    assert log == ["a", "b"]
    assert torch.equal(out["y"], torch.full((3,), 2.0)) and "prompts" in out and "x" in out
    assert set(ctx.metrics) == {"timing/a", "timing/b"} and all(v >= 0 for v in ctx.metrics.values())


def test_reading_a_column_nothing_upstream_writes_names_the_stage_and_the_column():
    flow = Dataflow([_stage("advantages", ["scores"], ["advantages"])], inputs=["prompts"])
    with pytest.raises(DataflowError, match=r"stage 'advantages' reads column 'scores'.*no stage writes it"):
        flow.check()


def test_a_writer_listed_after_its_reader_is_named_in_the_error():
    flow = Dataflow(
        [_stage("advantages", ["scores"]), _stage("reward", ["prompts"], ["scores"])], ["prompts"]
    )
    with pytest.raises(DataflowError, match=r"'advantages' reads column 'scores'.*stage 'reward' writes it"):
        flow.check()


def test_insert_after_replace_remove_and_connect():
    log = []
    flow = Dataflow(
        [_stage("gen", ["prompts"], ["r"], log=log), _stage("upd", ["r"], [], log=log)], ["prompts"]
    )
    flow.insert_after("gen", _stage("reward", ["r"], ["s"], log=log))
    flow.add_stage(_stage("filter", ["r"], [], log=log))
    assert flow.names == ["gen", "reward", "upd", "filter"]
    flow.connect("filter", "upd")  # no column links them; the edge moves upd after filter
    assert flow.names == ["gen", "reward", "filter", "upd"]
    flow.replace("reward", _stage("reward2", ["r"], ["s"], 5.0, log=log))
    out = flow.run(_prompts(), StepContext(step=1))
    assert log == ["gen", "reward2", "filter", "upd"] and torch.equal(out["s"], torch.full((3,), 5.0))
    flow.remove("filter")
    assert flow.names == ["gen", "reward2", "upd"]
    with pytest.raises(DataflowError, match="exists already"):
        flow.add_stage(_stage("gen"))
    with pytest.raises(DataflowError, match="no stage named 'nope'"):
        flow.insert_after("nope", _stage("x"))


def test_a_cycle_of_edges_is_refused():
    flow = Dataflow([_stage("a", [], ["x"]), _stage("b", ["x"], [])])
    with pytest.raises(DataflowError, match="wait on each other"):
        flow.connect("b", "a")
    assert flow.names == ["a", "b"]  # the refused edge is not kept
    with pytest.raises(DataflowError, match="'b' exists already"):
        flow.replace("a", _stage("b"))


def test_a_stage_that_does_not_write_what_it_declares_fails():
    flow = Dataflow([Stage("liar", lambda ctx, b: None, writes=("x",))])
    with pytest.raises(DataflowError, match=r"'liar' declares it writes \['x'\]"):
        flow.run(_prompts(), StepContext(step=1))


def test_a_filter_stage_may_drop_rows():
    keep_even = Stage(
        "filter", lambda ctx, b: b[torch.arange(0, len(b), 2)], reads=("prompts",), new_rows=True
    )
    out = Dataflow([keep_even], ["prompts"]).run(_prompts(5), StepContext(step=1))
    assert len(out) == 3


def test_run_knows_the_stage_it_is_in_when_one_raises():
    def boom(ctx, batch):
        raise RuntimeError("x")

    flow = Dataflow([Stage("ok", lambda ctx, b: None), Stage("boom", boom)])
    with pytest.raises(RuntimeError):
        flow.run(Batch(tensors={"a": torch.zeros(2)}), StepContext(step=1))
    assert flow.current == "boom"


def _scored_flow(log=None):
    """reward -> place (derives token from scores) -> adv (from token) -> update (reads adv)."""
    return Dataflow(
        [
            _stage("reward", ["prompts"], ["scores"], log=log),
            _stage("place", ["scores"], ["token"], log=log),
            _stage("adv", ["token"], ["adv"], log=log),
            _stage("update", ["adv"], log=log),
        ],
        ["prompts"],
    )


def test_a_rewrite_after_a_stage_derived_from_the_column_is_refused_naming_both_stages():
    flow = _scored_flow()
    late = _stage("late", ["scores"], ["scores"])
    with pytest.raises(
        DataflowError,
        match=r"stage 'late' rewrites column 'scores' after stage 'place' derived 'token' from it, and stage "
        r"'update' reads 'adv', which follows from 'token'.*Insert 'late' before 'place'",
    ):
        flow.insert_after("adv", late)  # through two derivations: scores -> token -> adv
    with pytest.raises(DataflowError, match=r"stage 'adv' reads 'token': the rewrite would not reach 'adv'"):
        flow.insert_after("place", late)
    assert flow.names == ["reward", "place", "adv", "update"]  # a refused edit is not kept
    with pytest.raises(DataflowError, match="'late' rewrites column 'scores'"):
        Dataflow([*flow.stages[:3], late, flow["update"]], ["prompts"])  # a graph built whole: the same


def test_a_rewrite_before_the_derivation_takes_effect_and_an_in_place_update_is_fine():
    log = []
    flow = _scored_flow(log)
    flow.insert_after("reward", _stage("bonus", ["scores"], ["scores"], value=3.0, log=log))
    out = flow.run(_prompts(), StepContext(step=1))
    assert log == ["reward", "bonus", "place", "adv", "update"]
    assert torch.equal(out["scores"], torch.full((3,), 3.0))
    flow.insert_after("update", _stage("after_all", ["scores"], ["scores"]))  # nothing reads past it


def test_refines_declares_a_rewrite_for_the_later_stages_only():
    flow = _scored_flow()
    narrow = Stage(
        "narrow", lambda ctx, b: {"scores": b["scores"] * 0}, ("scores",), ("scores",), refines=("scores",)
    )
    flow.insert_after("adv", narrow)
    assert flow.names == ["reward", "place", "adv", "narrow", "update"]
    flow.check()
    with pytest.raises(DataflowError, match=r"stage 'bad' refines \['x'\], which it does not write"):
        Stage("bad", lambda ctx, b: None, writes=("y",), refines=("x",))


def test_awaiting_columns_are_left_to_stages_still_to_come():
    flow = Dataflow([_stage("reward", ["prompts", "bonus"], ["scores"])], ["prompts"])
    flow.check(awaiting=["bonus"])
    flow.insert_after("reward", _stage("bonus", ["prompts"], ["bonus"]))
    with pytest.raises(
        DataflowError, match=r"'reward' reads column 'bonus'.*stage 'bonus' writes it but runs later"
    ):
        flow.check()


class _Counter:
    """A stage function that keeps state: how many steps it ran."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ctx, batch):
        self.calls += 1

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        if state["calls"] < 0:
            raise ValueError("a negative count")
        self.calls = state["calls"]


def test_stages_with_state_give_it_to_the_graph_and_get_it_back():
    counter = _Counter()
    flow = Dataflow([_stage("a", ["prompts"], ["x"]), Stage("count", counter)], inputs=["prompts"])
    flow.run(_prompts(), StepContext(step=1))
    flow.run(_prompts(), StepContext(step=2))
    assert flow.state_dict() == {"count": {"calls": 2}}  # stateless stages have none

    again = Dataflow([Stage("count", _Counter())])
    assert again.load_state_dict({"count": {"calls": 2}}) == []
    assert again["count"].fn.calls == 2


def test_restoring_state_names_what_does_not_match():
    flow = Dataflow([Stage("count", _Counter())])
    problems = flow.load_state_dict({"gone": {"calls": 1}})
    assert problems == [
        "the checkpoint has state for stage 'gone', which this graph lacks",
        "stage 'count' has no saved state and starts afresh",
    ]
    with pytest.raises(DataflowError, match="stage 'count': a negative count"):
        flow.load_state_dict({"count": {"calls": -1}})
