"""megarl's calc_tool task (`megarl data make calc_tool`, megarl.data.tasks.calc_tool): the last
"answer: N" of the response must be the exact result.

A multi-turn response is scored as its whole decoded text, tool outputs included (as verl does); a tool
output alone never counts, since it carries no "answer:". 1.0 when the last answer equals the ground
truth, else 0.0 (no answer at all included).
"""

from __future__ import annotations

import re

ANSWER = re.compile(r"answer:\s*(-?\d+)")


def compute_score(solution_str: str, ground_truth: str) -> float:
    answers = ANSWER.findall(solution_str)
    return 1.0 if answers and answers[-1] == str(ground_truth).strip() else 0.0
