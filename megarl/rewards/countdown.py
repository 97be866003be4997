"""Countdown (TinyZero's task): reach `target` with an arithmetic equation that uses each given number once.

The ground truth is `{"target": int, "numbers": [int, ...]}`. The response's equation is the last
`<answer>...</answer>` after the assistant turn starts. Scores (TinyZero's): `score` when the equation
uses exactly the given numbers and evaluates to the target, `format_score` when an equation is there
but wrong, 0 when there is none. The equation is parsed, never `eval`ed: numbers, + - * / and
parentheses only, at most 256 characters, every value within ±1e100 — an answer such as `99**98**97`
(TinyZero's `eval` never returns) or `2**3` scores as a wrong equation. (TinyZero also evaluates `//` and
`**`; a response using them scores format_score here.)
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
_ASSISTANT_MARKERS = ("Assistant:", "<|im_start|>assistant")
_MAX_CHARS = 256
_MAX_MAGNITUDE = 1e100
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def extract_solution(solution_str: str) -> str | None:
    """The last `<answer>` equation of the response (text after an assistant marker, if there is one)."""
    for marker in _ASSISTANT_MARKERS:
        if marker in solution_str:
            solution_str = solution_str.split(marker, 1)[1]
            break
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def uses_numbers(equation: str, numbers: list[int]) -> bool:
    """Whether the equation's numbers are exactly `numbers` (each once, any order)."""
    return sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(int(n) for n in numbers)


def evaluate(equation: str) -> float | None:
    """The equation's value, or None when it is not numbers, + - * / and parentheses within the bounds
    (module doc), or does not evaluate (division by zero)."""
    if len(equation) > _MAX_CHARS or not _ALLOWED.match(equation):
        return None
    try:
        return float(_value(ast.parse(equation, mode="eval").body))
    except (SyntaxError, ZeroDivisionError, ValueError, OverflowError):
        return None


def _value(node: ast.expr) -> int | float:
    value: int | float
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_value(node.left), _value(node.right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_value(node.operand))
    else:  # **, //, a call, a name, a tuple, ...
        raise ValueError(f"not arithmetic: {ast.dump(node)}")
    if not math.isfinite(value) or abs(value) > _MAX_MAGNITUDE:
        raise ValueError(f"{value} is out of bounds")
    return value


def compute_score(
    solution_str: str, ground_truth: dict[str, Any], format_score: float = 0.1, score: float = 1.0
) -> float:
    equation = extract_solution(solution_str)
    if equation is None:
        return 0.0
    numbers = [int(n) for n in ground_truth["numbers"]]
    if not uses_numbers(equation, numbers):
        return format_score
    value = evaluate(equation)
    if value is None:
        return format_score
    return score if abs(value - float(ground_truth["target"])) < 1e-5 else format_score
