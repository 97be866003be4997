"""One training step as a graph of named stages, each declaring the Batch columns it reads and writes.

    flow = Dataflow(inputs=("prompts", "attention_mask"))
    flow.add_stage(Stage("generate", generate, reads=("prompts",), writes=("responses", ...)))
    flow.insert_after("reward", Stage("length_penalty", penalise, reads=("responses",), writes=(...)))
    flow.replace("reward", Stage("reward", my_reward, ...))
    flow.connect("reward", "my_filter")       # my_filter runs after reward even if no column links them
    flow.connect(actor.output, reward_model.input)   # ports: the columns one stage writes and another reads
    batch = flow.run(prompts, StepContext(step=1))   # ctx.metrics gains timing/<stage> seconds

Stages run in list order, except where an edge requires otherwise: a stage runs after every stage listed
before it that writes a column it reads, and after every stage `connect`ed before it. `check()` (called
by `run` and by the trainer when it builds the graph) fails when a stage reads a column that neither the
inputs nor an earlier stage provide, naming the stage, the column and the stage that writes it, if any.

A graph edit never goes silently unused: a stage that rewrites a column after another stage derived a
column from it (directly or through further stages) while a later stage still reads what was derived is
refused by `check()` and by the edit itself, naming both stages and where to put the new one. A stage
that rewrites a column for the stages after it only, on purpose, says so with `refines`.

A stage's function gets the step context and the batch and returns the columns it wrote (a Batch or a
dict), which are merged into the batch; a stage built with `new_rows=True` returns the whole new batch
instead (it may drop rows: DAPO's dynamic sampling, a length filter). A function that keeps state from
step to step (a data position) has `state_dict()`/`load_state_dict()` (`StatefulFn`): the trainer saves
`flow.state_dict()` with each checkpoint and gives it back on resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from megarl.errors import EXIT_USAGE, MegarlError
from megarl.protocol import Batch


class DataflowError(MegarlError, ValueError):
    """A graph that cannot run, or a stage that broke its declared contract."""

    exit_code = EXIT_USAGE


@dataclass
class StepContext:
    """What a stage knows about the step besides the batch; stages add their metrics here."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    validate: bool = False  # a validation pass (rollout.val sampling, no training stages)


StageFn = Callable[[StepContext, Batch], Batch | dict[str, Any] | None]


@runtime_checkable
class StatefulFn(Protocol):
    """A stage function with state that must survive a checkpoint and resume (JSON-serialisable)."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Stage:
    """A named step of the graph: `fn(ctx, batch)` reading the columns `reads` and writing `writes`.

    `refines` names columns of `writes` the stage rewrites for the stages after it only: what earlier
    stages derived from the old values stays as it is, by design (generate extends the prompts'
    attention_mask over the responses; rollout correction narrows response_mask after the reward was
    placed on each response's last token). Any other rewrite of a column that something was derived from
    must come before the stage that derived it, or the graph is refused.
    """

    name: str
    fn: StageFn
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    new_rows: bool = False  # fn returns the whole batch with new rows (generate: n per prompt; filters)
    refines: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not set(self.refines) <= set(self.writes):
            raise DataflowError(
                f"stage {self.name!r} refines {sorted(set(self.refines) - set(self.writes))}, which it "
                f"does not write; refines names columns of writes ({', '.join(self.writes) or 'none'})"
            )

    def run(self, ctx: StepContext, batch: Batch) -> Batch:
        missing = [c for c in self.reads if c not in batch]
        if missing:
            raise DataflowError(f"stage {self.name!r} needs columns {missing}; the batch has {batch.keys()}")
        result = self.fn(ctx, batch)
        if self.new_rows:
            if not isinstance(result, Batch):
                raise DataflowError(f"stage {self.name!r} (new_rows) must return a Batch, got {type(result)}")
            out = result
        else:
            out = merge_columns(batch, result)
        absent = [c for c in self.writes if c not in out]
        if absent:
            raise DataflowError(f"stage {self.name!r} declares it writes {absent} but did not")
        return out


@dataclass(frozen=True)
class Port:
    """The columns a stage reads ("input") or writes ("output"), as a controller names them
    (`actor.output` = the generate stage's rollouts; `reward_model.input` = what the reward model reads)."""

    stage: str
    columns: tuple[str, ...]
    kind: Literal["input", "output"]
    label: str  # how the user wrote it, e.g. "actor.output"


def as_stage(item: Any) -> Stage:
    """A Stage, or the stage a controller method stands for (`flow.add_stage(reward_model.score)`)."""
    if isinstance(item, Stage):
        return item
    make = getattr(getattr(item, "__self__", None), "stage_for", None)
    if callable(make):
        return make(item.__name__)
    raise DataflowError(
        f"a flow takes a Stage or a controller method (e.g. reward_model.score), not {item!r}; wrap a "
        "function as Stage(name, fn, reads=(...), writes=(...)) with fn(ctx, batch) returning its columns"
    )


def merge_columns(batch: Batch, new: Batch | dict[str, Any] | None) -> Batch:
    """`batch` with the columns of `new` added or replaced (same rows); meta of both."""
    if new is None:
        return batch
    columns = dict(new.tensors.items()) | dict(new.non_tensors) if isinstance(new, Batch) else dict(new)
    tensors = {k: v for k, v in batch.tensors.items() if k not in columns}
    non_tensors = {k: v for k, v in batch.non_tensors.items() if k not in columns}
    for key, value in columns.items():
        (tensors if isinstance(value, torch.Tensor) else non_tensors)[key] = value
    meta = {**batch.meta, **(new.meta if isinstance(new, Batch) else {})}
    return Batch(tensors, non_tensors, meta)


class Dataflow:
    """An editable, checked graph of stages; `run(batch, ctx)` executes one step."""

    def __init__(self, stages: Iterable[Stage] = (), inputs: Iterable[str] = ()) -> None:
        self.inputs = tuple(inputs)
        self._stages: list[Stage] = []
        self._edges: set[tuple[str, str]] = set()
        self.current: str | None = None  # the stage `run` is in (still set when a stage raised)
        for stage in stages:
            self.add_stage(stage)

    @property
    def stages(self) -> list[Stage]:
        """The stages in execution order."""
        return self._ordered()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._ordered()]

    def __contains__(self, name: str) -> bool:
        return any(s.name == name for s in self._stages)

    def __getitem__(self, name: str) -> Stage:
        return self._stages[self._index(name)]

    def add_stage(self, stage: Stage | Any) -> Dataflow:
        """Append `stage` — a Stage or a controller method such as `reward_model.score` (it runs after
        everything it reads from)."""
        stage = as_stage(stage)
        self._refuse_duplicate(stage)
        return self._edit(lambda: self._stages.append(stage))

    def insert_after(self, name: str, stage: Stage | Any) -> Dataflow:
        """Put `stage` right after the stage `name`."""
        stage = as_stage(stage)
        self._refuse_duplicate(stage)
        position = self._index(name) + 1
        return self._edit(lambda: self._stages.insert(position, stage))

    def insert_before(self, name: str, stage: Stage | Any) -> Dataflow:
        """Put `stage` right before the stage `name`."""
        stage = as_stage(stage)
        self._refuse_duplicate(stage)
        position = self._index(name)
        return self._edit(lambda: self._stages.insert(position, stage))

    def replace(self, name: str, stage: Stage | Any) -> Dataflow:
        """Swap the stage `name` for `stage` (same position; edges to `name` now point at `stage`)."""
        stage = as_stage(stage)
        if stage.name != name and stage.name in self:
            raise DataflowError(f"a stage named {stage.name!r} exists already; remove it first")
        position = self._index(name)

        def swap() -> None:
            self._stages[position] = stage
            self._edges = {
                (stage.name if a == name else a, stage.name if b == name else b) for a, b in self._edges
            }

        return self._edit(swap)

    def remove(self, name: str) -> Dataflow:
        position = self._index(name)

        def drop() -> None:
            del self._stages[position]
            self._edges = {(a, b) for a, b in self._edges if name not in (a, b)}

        return self._edit(drop)

    def connect(self, upstream: str | Port, downstream: str | Port) -> Dataflow:
        """Make `downstream` run after `upstream`: two stage names (an edge no column expresses), or an
        output port and an input port (`flow.connect(actor.output, reward_model.input)`), which must
        share a column: what the upstream stage writes that the downstream one reads."""
        if isinstance(upstream, Port) or isinstance(downstream, Port):
            upstream, downstream = _port_edge(upstream, downstream)
        for name in (upstream, downstream):
            if name not in self:
                raise DataflowError(
                    f"no stage named {name!r} in this flow (stages: {', '.join(self.names)}); add the "
                    "controller's stage first (flow.add_stage(...))"
                )
        return self._edit(lambda: self._edges.add((upstream, downstream)))

    def check(self, awaiting: Iterable[str] = ()) -> None:
        """Raise DataflowError if some stage reads a column nothing upstream writes, or a column derived
        from one that a later stage rewrote (the rewrite would not reach it). `awaiting`: columns a stage
        still to be added will write (a graph built before the user's edits), not reported missing."""
        available = set(self.inputs) | set(awaiting)
        ordered = self._ordered()
        for position, stage in enumerate(ordered):
            for column in stage.reads:
                if column in available:
                    continue
                later = [s.name for s in ordered[position + 1 :] if column in s.writes]
                hint = (
                    f"stage {later[0]!r} writes it but runs later; move it with insert_before/connect"
                    if later
                    else f"no stage writes it (inputs: {', '.join(self.inputs) or 'none'})"
                )
                raise DataflowError(
                    f"stage {stage.name!r} reads column {column!r}, which nothing upstream writes: {hint}"
                )
            available.update(stage.writes)
        refuse_stale_reads(ordered, self.inputs)

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        """Every stage in order on `batch`; `timing/<stage>` seconds go into `ctx.metrics`."""
        self.check()
        for stage in self._ordered():
            start = time.perf_counter()
            self.current = stage.name
            batch = stage.run(ctx, batch)
            ctx.metrics[f"timing/{stage.name}"] = time.perf_counter() - start
        self.current = None
        return batch

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """{stage name: its function's state} of the stages whose function keeps state (`StatefulFn`)."""
        return {name: fn.state_dict() for name, fn in self._stateful().items()}

    def load_state_dict(self, states: dict[str, dict[str, Any]]) -> list[str]:
        """Give each stateful stage its state from `states` (a `state_dict()`); returns what did not
        match, one line each: saved state of a stage this graph lacks (not restored), and stateful
        stages without saved state (they start afresh). A state that does not fit its stage raises
        DataflowError naming the stage."""
        stateful = self._stateful()
        for name, fn in stateful.items():
            if name in states:
                try:
                    fn.load_state_dict(states[name])
                except ValueError as e:  # state another run saved (other data, another seed)
                    raise DataflowError(f"stage {name!r}: {e}") from None
        unused = [n for n in states if n not in stateful]
        fresh = [n for n in stateful if n not in states]
        return [f"the checkpoint has state for stage {n!r}, which this graph lacks" for n in unused] + [
            f"stage {n!r} has no saved state and starts afresh" for n in fresh
        ]

    def _stateful(self) -> dict[str, StatefulFn]:
        out: dict[str, StatefulFn] = {}
        for stage in self._stages:
            fn: object = stage.fn
            if isinstance(fn, StatefulFn):
                out[stage.name] = fn
        return out

    def describe(self) -> str:
        """One line per stage: name, reads -> writes."""
        return "\n".join(
            f"{s.name:>16}: {', '.join(s.reads) or '-'} -> {', '.join(s.writes) or '-'}"
            for s in self._ordered()
        )

    def _refuse_duplicate(self, stage: Stage) -> None:
        if stage.name in self:
            raise DataflowError(f"a stage named {stage.name!r} exists already; use replace() to swap it")

    def _edit(self, change: Callable[[], None]) -> Dataflow:
        """Apply `change` to the graph, undone if it makes a cycle or leaves a stale read (see `check`)."""
        stages, edges = list(self._stages), set(self._edges)
        change()
        try:
            refuse_stale_reads(self._ordered(), self.inputs)  # a cycle fails in _ordered, naming the stages
        except DataflowError:
            self._stages, self._edges = stages, edges
            raise
        return self

    def _index(self, name: str) -> int:
        for i, stage in enumerate(self._stages):
            if stage.name == name:
                return i
        raise DataflowError(f"no stage named {name!r}; stages are {[s.name for s in self._stages]}")

    def _ordered(self) -> list[Stage]:
        """List order, moved only where an edge demands it (a stable topological sort)."""
        names = [s.name for s in self._stages]
        after: dict[str, set[str]] = {n: set() for n in names}
        for i, stage in enumerate(self._stages):
            for earlier in self._stages[:i]:
                if set(stage.reads) & set(earlier.writes):
                    after[stage.name].add(earlier.name)
        for a, b in self._edges:
            after[b].add(a)
        ordered: list[Stage] = []
        done: set[str] = set()
        remaining = list(self._stages)
        while remaining:
            ready = next((s for s in remaining if after[s.name] <= done), None)
            if ready is None:
                cycle = ", ".join(s.name for s in remaining)
                raise DataflowError(f"the stages {cycle} wait on each other (a cycle of connect edges)")
            ordered.append(ready)
            done.add(ready.name)
            remaining.remove(ready)
        return ordered


def _port_edge(upstream: str | Port, downstream: str | Port) -> tuple[str, str]:
    """The (upstream, downstream) stage names of a port connection, refused unless an output meets an
    input that reads one of its columns."""
    if not (isinstance(upstream, Port) and isinstance(downstream, Port)):
        raise DataflowError(
            "connect two ports (connect(actor.output, reward_model.input)) or two stage names"
        )
    if upstream.kind != "output" or downstream.kind != "input":
        raise DataflowError(
            f"connect(upstream, downstream) takes an output then an input; got {upstream.label} "
            f"({upstream.kind}) and {downstream.label} ({downstream.kind})"
        )
    if not set(upstream.columns) & set(downstream.columns):
        raise DataflowError(
            f"{upstream.label} writes {', '.join(upstream.columns)}; {downstream.label} reads "
            f"{', '.join(downstream.columns)}: no column in common, so nothing flows between them"
        )
    return upstream.stage, downstream.stage


# A column's version is the stage that wrote it (None: the graph's inputs); a lineage maps each
# (column, version) a column was derived from to the first (position, stage, column) that derived from it.
Version = str | None
Lineage = dict[tuple[str, Version], tuple[int, str, str]]


def refuse_stale_reads(ordered: list[Stage], inputs: Iterable[str]) -> None:
    """Raise DataflowError when a stage reads a column derived (through any chain of stages) from a
    version of another column that a later stage rewrote without `refines`: that rewrite would not reach
    the reader, as a reward rewritten after the advantages were computed never reaches the update."""
    current: dict[str, list[Version]] = {c: [None] for c in inputs}  # the versions that count as current
    lineage: dict[str, Lineage] = {c: {} for c in inputs}
    for position, stage in enumerate(ordered):
        for column in stage.reads:
            _refuse_stale(stage, column, lineage.get(column, {}), current)
        inherited: Lineage = {}
        for column in stage.reads:
            for key, origin in lineage.get(column, {}).items():
                inherited[key] = min(origin, inherited.get(key, origin))
        for column in stage.writes:
            derived = dict(inherited)
            for read in stage.reads:
                if read in current and read != column:  # an in-place update derives from itself
                    key, origin = (read, current[read][-1]), (position, stage.name, column)
                    derived[key] = min(origin, derived.get(key, origin))
            for rewritten in stage.writes:  # what a stage writes together is consistent with itself
                if rewritten != column and any(source == rewritten for source, _ in derived):
                    derived[(rewritten, stage.name)] = (position, stage.name, column)
            lineage[column] = derived
            if column in stage.refines and column in current:
                current[column].append(stage.name)
            else:
                current[column] = [stage.name]


def _refuse_stale(stage: Stage, column: str, derived: Lineage, current: dict[str, list[Version]]) -> None:
    versions: dict[str, list[tuple[Version, tuple[int, str, str]]]] = {}
    for (source, version), origin in derived.items():
        versions.setdefault(source, []).append((version, origin))
    for source, seen in versions.items():
        if source == column or any(version in current[source] for version, _ in seen):
            continue
        _, deriver, derived_column = min(origin for _, origin in seen)
        writer = current[source][0]
        via = "" if derived_column == column else f", which follows from {derived_column!r}"
        raise DataflowError(
            f"stage {writer!r} rewrites column {source!r} after stage {deriver!r} derived {derived_column!r} "
            f"from it, and stage {stage.name!r} reads {column!r}{via}: the rewrite would not reach "
            f"{stage.name!r}. Insert {writer!r} before {deriver!r} (insert_before({deriver!r}, ...)) so it "
            f"runs first, or, if the stages after {writer!r} alone should see its {source!r}, declare "
            f"refines=({source!r},) on it"
        )
