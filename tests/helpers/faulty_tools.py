"""A user tool (rollout.multi_turn.tools: [tests/helpers/faulty_tools.py:calculator]) that fails on purpose,
a different way on each call, cycling: right, raises, hangs past the timeout, returns a dict, returns
10 000 characters. A run with it must complete and count each failure."""

from __future__ import annotations

import itertools
import time

_calls = itertools.count()
HANG_S = 3.0  # longer than the run's rollout.multi_turn.tool_timeout_s


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    k = next(_calls) % 5
    if k == 1:
        raise ZeroDivisionError("injected failure")
    if k == 2:
        time.sleep(HANG_S)
        return "too late"
    if k == 3:
        return {"value": 1}  # type: ignore[return-value]  # not text, on purpose
    if k == 4:
        return "7" * 10_000
    a, op, b = expression.split()
    return str(int(a) * int(b) if op == "*" else int(a) + int(b) if op == "+" else int(a) - int(b))
