"""Countdown (TinyZero's task): reach `target` with an arithmetic equation that uses each given number once.

The ground truth is `{"target": int, "numbers": [int, ...]}`. The response's equation is the last
`<answer>...</answer>` after the assistant turn starts. Scores (TinyZero's): `score` when the equation
uses exactly the given numbers and evaluates to the target, `format_score` when an equation is there
but wrong, 0 when there is none. Only digits, + - * /, parentheses and spaces are evaluated.
"""

from __future__ import annotations

import re
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
_ASSISTANT_MARKERS = ("Assistant:", "<|im_start|>assistant")


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
    """The equation's value, or None when it has other characters or does not evaluate."""
    if not _ALLOWED.match(equation):
        return None
    try:
        return float(eval(equation, {"__builtins__": None}, {}))  # noqa: S307 - characters checked above
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError, OverflowError):
        return None


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
