"""Fault injection for tests of dead, hung and failing workers (the only fake megarl has).

`MEGARL_FAULT` holds `;`-separated specs `KIND@TARGET[#CALLS][/RANK]`:

    kill@actor.update#2/1                           SIGKILL rank 1 at its 2nd actor.update call
    hang@actor.generate#1/1                         rank 1 sleeps forever in its 1st actor.generate
    raise@critic.values                             every critic.values call raises RuntimeError
    nan@actor.update#2-3                            actor.update calls 2 and 3 compute a NaN loss, every rank
    kill@actor.save_checkpoint:model_written#2/1    rank 1 dies at that named point of its 2nd save

KIND: kill | hang | raise | nan. TARGET: `role.method` (a dispatched worker call) or
`role.method:point` (a named point inside a call, reached through `point()`; nan does not apply).
CALLS: `N` or `N-M`, 1-based, counted per target and rank (default: every call). RANK: the worker's
rank in its group (default: every rank).

Workers call `on_call` before every dispatched method and run it under `nan_forward`
(`Worker.execute`), and code with named points calls `point`: the code under test never asks. Without
`MEGARL_FAULT` each costs a dict lookup.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from megarl.errors import EXIT_USAGE, MegarlError

ENV = "MEGARL_FAULT"
KINDS = ("kill", "hang", "raise", "nan")

_SPEC = re.compile(
    r"(?P<kind>\w+)@(?P<role>\w+)\.(?P<method>\w+)(?::(?P<point>[\w.-]+))?"
    r"(?:#(?P<first>\d+)(?:-(?P<last>\d+))?)?(?:/(?P<rank>\d+))?"
)


class FaultSpecError(MegarlError, ValueError):
    """MEGARL_FAULT cannot be parsed; the message names the bad spec and the grammar."""

    exit_code = EXIT_USAGE


class InjectedFault(MegarlError, RuntimeError):
    """What `raise@...` raises."""


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" | "hang" | "raise" | "nan"
    target: str  # "role.method" or "role.method:point"
    first: int = 1  # 1-based call range [first, last]; last None = no end
    last: int | None = None
    rank: int | None = None  # None = every rank

    def applies(self, target: str, call: int, rank: int) -> bool:
        return (
            self.target == target
            and (self.rank is None or self.rank == rank)
            and self.first <= call
            and (self.last is None or call <= self.last)
        )


def parse(text: str) -> list[Fault]:
    """The faults of a MEGARL_FAULT value; FaultSpecError on the first bad spec."""
    faults = []
    for spec in (s.strip() for s in text.split(";")):
        if not spec:
            continue
        m = _SPEC.fullmatch(spec)
        if m is None:
            raise _error(spec, "expected KIND@ROLE.METHOD[:POINT][#N or #N-M][/RANK]")
        kind = m["kind"]
        if kind not in KINDS:
            raise _error(spec, f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        if kind == "nan" and m["point"]:
            raise _error(spec, "nan poisons a call's loss; give a method (nan@actor.update), not a point")
        first = int(m["first"]) if m["first"] else 1
        last = int(m["last"]) if m["last"] else (first if m["first"] else None)
        if first < 1 or (last is not None and last < first):
            raise _error(spec, "calls count from 1 and a range N-M needs N ≤ M")
        target = f"{m['role']}.{m['method']}" + (f":{m['point']}" if m["point"] else "")
        faults.append(Fault(kind, target, first, last, int(m["rank"]) if m["rank"] else None))
    return faults


def _error(spec: str, why: str) -> FaultSpecError:
    return FaultSpecError(
        f"{ENV}: bad fault spec {spec!r}: {why} (e.g. kill@actor.update#2/1, nan@actor.update#2-3)"
    )


_calls: Counter = Counter()  # (target, rank) -> calls so far in this process
_parsed: tuple[str, list[Fault]] = ("", [])


def active() -> list[Fault]:
    """The faults of the current MEGARL_FAULT (parsed once per value)."""
    global _parsed
    text = os.environ.get(ENV, "")
    if text != _parsed[0]:
        _parsed = (text, parse(text))
    return _parsed[1]


def reset() -> None:
    """Forget the call counts (tests)."""
    _calls.clear()


def on_call(role: str, method: str, rank: int) -> None:
    """Count a dispatched call of `role.method` on `rank` and apply a kill/hang/raise fault for it."""
    _hit(f"{role}.{method}", rank)


def point(role: str, name: str, rank: int) -> None:
    """Reach the named point `name` ("method:point", e.g. "save_checkpoint:model_written") of `role`."""
    _hit(f"{role}.{name}", rank)


def poisoned(role: str, method: str, rank: int) -> bool:
    """Whether the current `role.method` call on `rank` has a nan fault (`nan_forward` makes its loss NaN)."""
    faults = active()
    if not faults:
        return False
    target = f"{role}.{method}"
    call = _calls[(target, rank)]
    return any(f.kind == "nan" and f.applies(target, call, rank) for f in faults)


@contextmanager
def nan_forward(role: str, method: str, rank: int) -> Iterator[None]:
    """Run the current `role.method` call on `rank`; when a nan fault names it, every module output
    that takes part in a backward is NaN inside it, so the call's loss and gradient norm are NaN on this
    rank and its optimizer skips the update, as after a real overflow."""
    if not poisoned(role, method, rank):
        yield
        return
    import torch

    nan = float("nan")

    def poison(module, args, output):
        # out of place: a module may return one of its parameters (megatron's skip_bias_add bias)
        if isinstance(output, torch.Tensor):
            return output * nan if output.requires_grad else None
        if type(output) in (tuple, list):  # megatron's (output, bias) pairs
            return type(output)(
                o * nan if isinstance(o, torch.Tensor) and o.requires_grad else o for o in output
            )
        return None

    handle = torch.nn.modules.module.register_module_forward_hook(poison)
    try:
        yield
    finally:
        handle.remove()


def _hit(target: str, rank: int) -> None:
    faults = active()
    if not faults:
        return
    _calls[(target, rank)] += 1
    call = _calls[(target, rank)]
    for fault in faults:
        if fault.kind != "nan" and fault.applies(target, call, rank):
            _apply(fault, target, call, rank)


def _apply(fault: Fault, target: str, call: int, rank: int) -> None:
    where = f"{target} call {call} on rank {rank} (pid {os.getpid()})"
    print(f"megarl: injected fault {fault.kind} at {where}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "hang":
        threading.Event().wait()
    raise InjectedFault(f"injected fault at {where} ({ENV})")
