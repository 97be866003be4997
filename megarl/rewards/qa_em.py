"""Search-R1's exact-match QA rule (`searchR1_nq`, `searchR1_hotpotqa`, ...), as verl's
`search_r1_like_qa_em.compute_score` scores it: the last `<answer>...</answer>` of the response,
normalised (lower case, punctuation and the articles a/an/the dropped, whitespace collapsed), equal to one
of the ground truth's `target` answers scores 1 — a quarter of that when the response has more than 10
`<answer>` or `</answer>` tags — and anything else 0.
"""

from __future__ import annotations

import re
import string
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_MAX_TAGS = 10


def normalize_answer(text: str) -> str:
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_answer(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def targets(ground_truth: Any) -> list[str]:
    """The accepted answers: verl's `{"target": [...]}` (a list, an array from parquet, or one string)."""
    target = ground_truth["target"] if isinstance(ground_truth, dict) else ground_truth
    return [target] if isinstance(target, str) else [str(t) for t in target]


def compute_score(
    solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0
) -> float:
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    said = normalize_answer(answer)
    if not any(normalize_answer(t) == said for t in targets(ground_truth)):
        return format_score
    too_many = max(solution_str.count("<answer>"), solution_str.count("</answer>")) > _MAX_TAGS
    return score / 4 if too_many else score
