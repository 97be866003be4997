"""Rules every field of a `MegarlConfig` obeys on its own, read from the schema's type hints:

- a choice (a `Literal`, also inside `| None` or `list[...]`) holds one of its allowed values;
- a number (a `float`, also inside `| None`, `list[...]` or `dict[str, ...]`) is finite.

No float key takes inf or NaN: where a key has an "off" or "no limit" value it is 0, -1 or null, which its
schema comment names (trainer.worker_timeout_s=inf would overflow the process groups' timedelta). A NaN or
inf is reported before the cross-field rules run, since every rule comparing it would blame another key
(`actor.optimizer.lr=nan` failing `min_lr ≤ lr`).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any, Literal

from megarl.config.errors import join

__all__ = ["check_choices", "non_finite_numbers"]


def check_choices(cfg: Any, problems: list[str]) -> None:
    """Every Literal-typed field holds an allowed value (configs built in Python skip omegaconf's check)."""
    for key, value, hint, _ in _fields(cfg):
        allowed, is_list = _choices_of(hint)
        if not allowed or value is None:
            continue
        for item in value if is_list else [value]:
            if item not in allowed:
                where = f"{key} contains {item!r}" if is_list else f"{key}={item!r}"
                problems.append(f"{where}, which is not allowed; use one of {join(allowed)}")


def non_finite_numbers(cfg: Any) -> list[str]:
    """One problem line per float field (or list item, or mapping entry) that is NaN or ±inf."""
    problems = []
    for key, value, hint, default in _fields(cfg):
        if not _holds_float(hint) or value is None:
            continue
        if isinstance(value, dict):
            problems += [
                f"{key}.{name}={v} is not a finite number; set a finite value or remove it"
                for name, v in value.items()
                if _is_number(v) and not math.isfinite(v)
            ]
        elif isinstance(value, list | tuple):
            bad = [v for v in value if _is_number(v) and not math.isfinite(v)]
            if bad:
                shown = "[" + ", ".join(str(v) for v in value) + "]"
                fix = f"e.g. {key}={default}" if isinstance(default, list) else "with finite items"
                problems.append(f"{key}={shown} holds {join(bad)}: every item must be a finite number; {fix}")
        elif _is_number(value) and not math.isfinite(value):
            fix = f", e.g. {key}={default}" if _is_number(default) else " or null"
            problems.append(f"{key}={value} is not a finite number; set a finite value{fix}")
    return problems


def _fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, Any]]:
    """(dotted key, value, type hint, schema default) of every leaf field under `obj`, sections recursed."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            yield from _fields(value, f"{key}.")
        else:
            yield key, value, hints[f.name], _default(f)


def _default(f: Field) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def _choices_of(tp: Any) -> tuple[tuple[Any, ...], bool]:
    """(allowed values, is_list) of a Literal / Literal | None / list[Literal] type; () when not a choice."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return typing.get_args(tp), False
    if origin is list:
        return _choices_of(typing.get_args(tp)[0])[0], True
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg), False
    return (), False


def _holds_float(tp: Any) -> bool:
    """float, float | None, list[float], dict[str, float]."""
    if tp is float:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        return args[1] is float
    return any(_holds_float(a) for a in args if a is not type(None))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
