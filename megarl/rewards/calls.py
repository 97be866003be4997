"""One call of a reward function on one row, the same in a reward worker process and in the driver:
the row's score and numeric extras (`Scored`), or what went wrong (`Failed`) — an exception, a
`sys.exit`, a result that is no score, or (in a worker) the time limit. Imports nothing heavy: the
reward workers run it."""

from __future__ import annotations

import math
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scored:
    value: float
    extras: dict[str, float]


@dataclass(frozen=True)
class Failed:
    summary: str  # one line: "ValueError: cannot parse", "timed out after 10s", "process died with signal 11"
    detail: str = ""  # the traceback, where there is one


Outcome = Scored | Failed


class RewardTimeout(BaseException):
    """Raised inside a reward function that ran past reward.timeout_s (a BaseException: a function's own
    `except Exception` does not swallow it)."""


class CallClock:
    """A reward worker's watch over its calls: while a chunk is scored, SIGALRM ticks every `tick`
    seconds (two system calls per chunk, none per row) and interrupts the current call once it has run
    past `timeout_s` — Python code only; the pool kills a worker stuck in C code."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.tick = min(0.25, timeout_s / 4)
        self.started: float | None = None  # monotonic start of the call in progress
        signal.signal(signal.SIGALRM, self._check)

    def __enter__(self) -> CallClock:
        signal.setitimer(signal.ITIMER_REAL, self.tick, self.tick)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _check(self, signum: int, frame: Any) -> None:
        started = self.started
        if started is not None and time.monotonic() - started > self.timeout_s:
            self.started = None
            raise RewardTimeout()


def call_reward(fn: Callable[..., Any], kwargs: dict[str, Any], clock: CallClock | None = None) -> Outcome:
    """`fn(**kwargs)` as an Outcome, watched by `clock` (a reward worker's) when given."""
    try:
        if clock is not None:
            clock.started = time.monotonic()
        try:
            result = fn(**kwargs)
        finally:
            if clock is not None:
                clock.started = None
        value, extras = as_score(result)
        return Scored(value, extras)
    except RewardTimeout as e:
        assert clock is not None
        return Failed(f"timed out after {clock.timeout_s:g}s", _traceback(e))
    except SystemExit as e:
        return Failed(f"the reward function called sys.exit({e.code!r})", _traceback(e))
    except Exception as e:
        return Failed(f"{type(e).__name__}: {e}", _traceback(e))


def as_score(result: Any) -> tuple[float, dict[str, float]]:
    """(score, numeric extras) of a reward function's result: a number, or a dict with a "score"."""
    extras: dict[str, float] = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise TypeError(f"the reward function returned a dict without a 'score' key: {sorted(result)}")
        extras = {k: _number(v) for k, v in result.items() if k != "score" and _is_number(v)}
        result = result["score"]
    if not _is_number(result):
        raise TypeError(
            f"the reward function returned {_kind(result)}; expected a number or a dict with a 'score'"
        )
    value = _number(result)
    if not math.isfinite(value):
        raise ValueError(f"the reward function returned {value}; a score must be finite")
    return value, extras


def _is_number(value: Any) -> bool:
    if isinstance(value, int | float):  # bools are ints: True scores 1
        return True
    # a torch tensor or numpy scalar/array of one element (checked without importing either)
    root = type(value).__module__.split(".")[0]
    if root not in ("torch", "numpy"):
        return False
    size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", None)
    return size == 1


def _number(value: Any) -> float:
    return float(value.item() if hasattr(value, "item") else value)


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    name = type(value).__name__
    return f"a {name} of shape {tuple(shape)}" if shape is not None else f"a {name} ({value!r:.40})"


def _traceback(e: BaseException) -> str:
    """The traceback from the reward function's own frame on (this module's frame dropped)."""
    tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(e), e, tb)).rstrip()
