"""verl's `numina_*` rule (verl: prime_math) and `hiyouga/geometry3k` rule (verl: geo3k with mathruler).

numina_*: the answer is taken after the last "answer:"/"answer is"/"answers are", before a trailing "is the
answer", from the last `\\boxed{}`/`\\fbox{}`, before the last ". ", and after the last "be "/"is "/"are "/
"="/": "/"get "; it scores 1.0 when PRM800K's grader (`prm800k`, prime_math's variant) accepts it, else
when `math_equal` does (equal strings, equal numbers within 1e-4 relative, also against the truth x100 and
/100, element-wise tuples and intervals), with π read as math.pi and as 3.14 where either side has
`\\pi`; else 0.0.

geometry3k: 0.9 x (PRM800K's grader, mathruler's variant, accepts the last `\\boxed{}`) + 0.1 x (the
response is `<think>…</think>…\\boxed{…}…`).

verl's `math_equal` ends with a sympy comparison (parse_expr, then sympy's LaTeX parser; simplify; N) that
never accepts in verl 0.9.1: it uses `timeout_limit`, a decorator, as a context manager, and the error that
raises is swallowed. megarl scores what verl scores and so has no such step (docs/verl-rewards.md).
verl runs PRM800K's sympy step in a child process with a 10 s limit; megarl runs it in the reward worker,
under the reward pool's own time limit.
"""

from __future__ import annotations

import math
import re
from math import isclose

from megarl.rewards import prm800k

NUMINA_SOURCES = ("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                  "numina_cn_k12", "numina_olympiads")  # fmt: skip


def _last_boxed(text: str) -> str | None:
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    left, depth = None, 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
            left = i if left is None else left
        elif text[i] == "}":
            depth -= 1
            if depth == 0 and left is not None:
                return text[left + 1 : i].strip()
    return None


def _cut(response: str) -> str:
    response = response.strip()
    return response[:-2] if response.endswith("\n") else response


def match_answer(response: str) -> str:
    """The answer part of a numina response (module doc)."""
    for marker in ("answer:", "answer is", "answers are"):
        idx = response.lower().rfind(marker)
        if idx != -1:
            response = _cut(response[idx + len(marker) :])
    for marker in ("is answer", "is the answer", "are answers", "are the answers"):
        idx = response.lower().rfind(marker)
        if idx != -1:
            response = _cut(response[:idx])
    boxed = _last_boxed(response)
    if boxed:
        response = boxed
    if ". " in response:
        response = response[: response.lower().rfind(". ")].strip()
    for marker in ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n"):
        idx = response.lower().rfind(marker)
        if idx != -1:
            response = _cut(response[idx + len(marker) :])
    return response


def _as_number(s: object) -> float | None:
    text = str(s)
    try:
        return float(text.replace("{,}", "")) if "{,}" in text else float(text.replace(",", ""))
    except ValueError:
        return None


_ARITHMETIC = re.compile(r"^[0-9.*+\-/() ]+$")


def _normalize(answer: object, pi: float) -> object:
    if isinstance(answer, str) and re.match(r"\$\d+(\.\d+)?", answer):
        return answer[1:]
    if isinstance(answer, str) and re.match(r"^\d+(\.\d+)?(\\)?%$", answer):
        return answer.replace("\\%", "").replace("%", "")
    if isinstance(answer, str) and "_" in answer:  # a base subscript: 101_2 -> 101
        return int(float(answer.split("_")[0]))  # ValueError when not a number: the row scores 0
    if isinstance(answer, str) and "\\pi" in answer:
        idx = answer.find("\\pi")
        while idx != -1:
            factor = "*" if idx > 0 and answer[idx - 1].isdigit() else "1*"
            answer = f"{answer[:idx]}{factor}{pi}{answer[idx + 3 :]}"
            idx = answer.find("\\pi", idx + 1)
        if _ARITHMETIC.match(answer):
            try:
                return eval(answer, {"__builtins__": {}}, {})  # noqa: S307 - digits and operators only
            except (SyntaxError, ArithmeticError, TypeError):
                pass
    return answer


def _interval(prediction: str) -> str:
    for pattern, left, right in ((r"^Interval\((.*)\)$", "[", "]"), (r"^Interval\.Ropen\((.*)\)$", "[", ")"),
                                 (r"^Interval\.Lopen\((.*)\)$", "(", "]"), (r"^Interval\.open\((.*)\)$", "(", ")")):  # fmt: skip
        m = re.match(pattern, prediction)
        if m:
            return f"{left}{m.group(1)}{right}"
    return prediction


def math_equal(prediction: object, reference: object, pi: float = math.pi) -> bool:
    """verl's prime_math `math_equal` as verl 0.9.1 runs it (module doc)."""
    prediction, reference = _normalize(prediction, pi), _normalize(reference, pi)
    if isinstance(prediction, str) and len(prediction) > 1000:
        prediction = prediction[:1000]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    pred_num, ref_num = _as_number(prediction), _as_number(reference)
    if pred_num is not None and ref_num is not None:
        return any(isclose(r, pred_num, rel_tol=1e-4) for r in (ref_num / 100, ref_num, ref_num * 100))
    if not prediction and prediction not in (0, False):
        return False
    ref, pred = str(reference).strip(), _interval(str(prediction).strip())
    pred_s, ref_s = pred, ref
    if (pred.startswith("[") and pred.endswith("]") and not ref.startswith("(")) or (
        pred.startswith("(") and pred.endswith(")") and not ref.startswith("[")
    ):
        pred_s, ref_s = pred_s.strip("[]()"), ref_s.strip("[]()")
    for ch in "{}()":
        pred_s, ref_s = pred_s.replace(ch, ""), ref_s.replace(ch, "")
    if pred_s == ref_s:
        return True
    if pred and ref and pred[0] in "([" and pred[-1] in ")]" and pred[0] == ref[0] and pred[-1] == ref[-1]:
        pp, rp = pred[1:-1].split(","), ref[1:-1].split(",")
        if len(pp) == len(rp) and all(math_equal(p, r) for p, r in zip(pp, rp, strict=True)):
            return True
    if "," in pred and "," in ref:
        pp, rp = [x.strip() for x in pred.split(",")], [x.strip() for x in ref.split(",")]
        if len(pp) == len(rp):
            return all(math_equal(p, r) for p, r in zip(pp, rp, strict=True))
    if pred.startswith("Point") and ref[:1] == "(" and ref[-1:] == ")":
        pp, rp = pred[pred.find("(") + 1 : -1].split(","), ref[1:-1].split(",")
        if len(pp) == len(rp) and all(math_equal(p, r) for p, r in zip(pp, rp, strict=True)):
            return True
    return False  # verl 0.9.1's last step, sympy, never accepts (module doc)


def numina_score(solution_str: str, ground_truth: str) -> float:
    """verl's `numina_*` score: 1.0 or 0.0 (module doc)."""
    answer = match_answer(solution_str)
    if prm800k.grade_answer(answer, ground_truth, mathruler=False):
        return 1.0
    try:
        if "\\pi" in answer or "\\pi" in ground_truth:
            return float(any(math_equal(answer, ground_truth, pi=pi) for pi in (math.pi, 3.14)))
        return float(math_equal(answer, ground_truth))
    except Exception:  # noqa: BLE001 - verl scores a row whose comparison raises 0
        return 0.0


_THINK_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def _boxed_content(text: str) -> str:
    """mathruler's extraction: the last `\\boxed{...}` (balanced), or the string "None"."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return "None"
    depth = 0
    content = text[start + len("\\boxed{") :]
    for i, ch in enumerate(content):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == -1:
            return content[:i].strip()
    return "None"


def geometry3k_score(solution_str: str, ground_truth: str) -> float:
    """verl's `hiyouga/geometry3k` score: 0.9 x accuracy + 0.1 x format (module doc)."""
    accurate = prm800k.grade_answer(_boxed_content(solution_str), ground_truth, mathruler=True)
    formatted = _THINK_FORMAT.fullmatch(solution_str) is not None
    return (1.0 - 0.1) * float(accurate) + 0.1 * float(formatted)
