"""GSM8K (`openai/gsm8k`): the answer after `#### `, compared as a string with the ground truth (verl's rule).

`strict` takes the last `#### <number>` of the response; `flexible` the last number anywhere in it.
Commas and dollar signs are dropped from the answer. Like verl, only the last 300 characters are read,
which keeps a runaway response's regex cost bounded.
"""

from __future__ import annotations

import re
from typing import Literal

_CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The response's final answer, or None when it has none in the required format."""
    text = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    if method != "flexible":
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    numbers = [n for n in _NUMBER.findall(text) if n not in ("", ".")]
    return numbers[-1] if numbers else None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` for the right answer, `format_score` for a wrong one in the format, 0 for no answer."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth) else format_score
