"""`ConfigError` and the helpers that phrase one problem line: key=value, what is wrong, how to fix it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from megarl.distributed.layout import divisors
from megarl.errors import EXIT_USAGE, MegarlError

__all__ = ["ConfigError", "at_least", "divisors", "in_range", "join", "need_divides", "show_value"]


class ConfigError(MegarlError, ValueError):
    """An invalid configuration; `problems` holds one actionable line per problem."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        count = f"{len(self.problems)} problem" + ("s" if len(self.problems) != 1 else "")
        super().__init__(f"invalid megarl config ({count}):" + "".join(f"\n  - {p}" for p in self.problems))


def join(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


def need_divides(
    problems: list[str], key: str, value: int, limits: Sequence[tuple[str, int]], why: str = ""
) -> bool:
    """Check that `value` divides every named limit; one message suggests values that divide them all."""
    failed = [f"{name}={n}" for name, n in limits if n % value]
    if failed:
        good = divisors(math.gcd(*(n for _, n in limits)))
        problems.append(f"{key}={value} does not divide {' and '.join(failed)}{why}; use one of {join(good)}")
    return not failed


def at_least(problems: list[str], key: str, value: float, low: float, fix: str) -> bool:
    if value < low:
        problems.append(f"{key}={value} must be ≥ {low}; {fix}")
        return False
    return True


def in_range(problems: list[str], key: str, value: float, interval: str, ok: bool, fix: str) -> None:
    if not ok:
        problems.append(f"{key}={value} must be in {interval}; {fix}")


def show_value(value: Any) -> str:
    """`value` as a user writes it in an override: null, true/false, [a, b], {k: v}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show_value(v)}" for k, v in value.items()) + "}"
    return str(value)
