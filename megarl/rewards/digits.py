"""megarl's generated digit tasks (`megarl/digits_*`, see `megarl.data.tasks`): exact-match answers.

The response must be the answer and nothing else (surrounding whitespace aside): "13459" for
`sort 31594`. 1.0 when it is, else 0.0 — so the mean reward is the accuracy.
"""

from __future__ import annotations


def compute_score(solution_str: str, ground_truth: str) -> float:
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0
