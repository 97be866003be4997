"""DAPO's math rule (`math_dapo`, `math`, `math_dapo_reasoning`, `aime*`): +1 for a right answer, -1 for
anything else, as verl's `math_dapo.compute_score` scores it.

Only the last 300 characters of the response are read. The answer is the last `Answer: ...` line
(case-insensitive), normalised as Minerva normalises final answers (`normalize_final_answer`); with no such
line, the last `\\boxed{...}` of the last 100 characters, compared *as written* with the ground truth (not
normalised: `\\boxed{1,000}` against `1000` is wrong, as in verl). The result is verl's dict:
`{"score": ±1.0, "acc": 0/1, "pred": the answer read}` (`reward/acc/mean` is logged).
"""

from __future__ import annotations

import re
from typing import Any

_TAIL_CHARS = 300
_BOX_TAIL_CHARS = 100
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_NO_ANSWER = "[INVALID]"

# Minerva's normalisation, as data: literal replacements in order, then words and marks dropped in order
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_UNITS = "square ways integers dollars mph inches hours km units".split()
_WORDS = "sue points feet minutes digits cents degrees cm gm pounds meters meals edges students".split()
_DROP = (
    *_UNITS,
    "\\ldots",
    *_WORDS,
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_UNWRAP = (  # (pattern, replacement): keep what a wrapper holds
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),  # the first $...$ of the answer
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),  # \sqrt2 -> \sqrt{2}
)


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation: the part after the last `=`, units and filler words dropped, `\\text{}`
    and similar wrappers unwrapped, shorthand `\\frac`/`\\sqrt` braced, commas of a plain integer dropped."""
    answer = answer.split("=")[-1]
    for old, new in _REPLACE:
        answer = answer.replace(old, new)
    for word in _DROP:
        answer = answer.replace(word, "")
    for pattern, replacement in _UNWRAP:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` of `text` (braces balanced); None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0 and text[i] == "}":
            return text[start + len("\\boxed{") : i]
    return None


def verify(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> tuple[bool, str | None]:
    """(right, the answer read): the `Answer:` line first, else the last box (only the box when strict)."""
    boxed = last_boxed(solution_str[-_BOX_TAIL_CHARS:])
    if not strict_box_verify:
        lines = _ANSWER_LINE.findall(solution_str)
        pred = normalize_final_answer(lines[-1] if lines else _NO_ANSWER)
        if pred != _NO_ANSWER or boxed is None:
            return pred == normalize_final_answer(ground_truth), pred
    return boxed == ground_truth, boxed


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> dict[str, Any]:
    """verl's DAPO score: `{"score": 1.0 or -1.0, "acc": right, "pred": the answer read}`."""
    right, pred = verify(solution_str[-_TAIL_CHARS:], ground_truth, strict_box_verify)
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
