"""Rule rewards under verl's data_source names: GSM8K, MATH \\boxed{} with normalisation, countdown."""

from __future__ import annotations

import random
import re
import time

import pytest

from megarl.rewards import (
    UnknownDataSource,
    countdown,
    default_compute_score,
    gsm8k,
    known_data_sources,
    math_boxed,
    register_reward,
    registry,
)
from megarl.rewards.registry import reward_for

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("response", "strict", "flexible"),
    [
        ("3 + 4 = 7 so #### 7", "7", "7"),
        ("#### 1,234 dollars", "1234", "1,234"),
        ("first #### 5 then #### 6", "6", "6"),
        ("the answer is 42.", None, "42."),
        ("no digits here", None, None),
        ("#### -3", "-3", "-3"),
    ],
)
def test_gsm8k_extracts_the_final_answer(response, strict, flexible):
    assert gsm8k.extract_solution(response, "strict") == strict
    assert gsm8k.extract_solution(response, "flexible") == flexible


def test_gsm8k_scores_and_reads_only_the_tail():
    assert default_compute_score("openai/gsm8k", "so #### 72", "72") == 1.0
    assert default_compute_score("openai/gsm8k", "so #### 71", "72") == 0.0
    assert default_compute_score("openai/gsm8k", "so 72", "72") == 0.0  # strict needs ####
    assert gsm8k.compute_score("so #### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("#### 72" + " pad" * 100, "72") == 0.0  # beyond the last 300 characters


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("\\frac12", "\\frac{1}{2}"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("\\left( 3, 4 \\right)", "(3,4)"),
        ("x = 5", "5"),
        ("90^\\circ", "90"),
        ("10\\%", "10"),
        ("\\$18", "18"),
        (".5", "0.5"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("5 \\text{ cm}", "5"),
        ("\\frac1{x}", "\\frac{1}{x}"),
    ],
)
def test_math_normalisation_makes_equivalent_answers_equal(answer, truth):
    assert math_boxed.is_equiv(answer, truth)


@pytest.mark.parametrize(
    ("answer", "truth"), [("\\frac{1}{3}", "\\frac{1}{2}"), ("(3,4)", "(4,3)"), ("12", "1.2")]
)
def test_math_normalisation_keeps_different_answers_apart(answer, truth):
    assert not math_boxed.is_equiv(answer, truth)


def test_math_scores_the_last_boxed_answer():
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert default_compute_score(source, "so \\boxed{2} no, \\boxed{\\frac{1}{2}}", "\\frac12") == 1.0
    assert math_boxed.last_boxed_only_string("a \\boxed{\\frac{1}{2}} b") == "\\boxed{\\frac{1}{2}}"
    assert math_boxed.last_boxed_only_string("\\boxed 5$ done") == "\\boxed 5"
    assert math_boxed.last_boxed_only_string("\\fbox{7}") == "\\fbox{7}"
    assert math_boxed.compute_score("\\boxed{5}", "5") == 1.0
    assert math_boxed.compute_score("the answer is 5", "5") == 0.0
    assert math_boxed.compute_score("\\boxed{5", "5") == 0.0  # unbalanced braces: no answer


def test_countdown_checks_numbers_and_target():
    truth = {"target": 24, "numbers": [4, 6, 1]}
    assert (
        default_compute_score("countdown", "<|im_start|>assistant <answer>4 * 6 * 1</answer>", truth) == 1.0
    )
    assert countdown.compute_score("Assistant: <answer>(6 - 1) * 4</answer>", truth) == 0.1  # = 20
    assert countdown.compute_score("<answer>4 * 6</answer>", truth) == 0.1  # leaves out 1
    assert countdown.compute_score("<answer>4 * 6 * 1 * 1</answer>", truth) == 0.1  # 1 twice
    assert countdown.compute_score("<answer>__import__('os')</answer>", truth) == 0.1
    assert (
        countdown.compute_score("<answer>4 / (6 - 6) + 1</answer>", {"target": 1, "numbers": [4, 6, 6, 1]})
        == 0.1
    )
    assert countdown.compute_score("4 * 6 * 1", truth) == 0.0  # no <answer> tags
    # TinyZero's names: anything containing "countdown" (e.g. Jiayi-Pan/Countdown-Tasks-3to4 preprocessed)
    assert reward_for("countdown_3to4") is reward_for("countdown")


def _tinyzero_score(answer: str, truth: dict) -> float:
    """TinyZero's countdown score with its `eval` (safe here: the sweep's answers are made below)."""
    numbers = sorted(int(n) for n in re.findall(r"\d+", answer))
    if numbers != sorted(truth["numbers"]):
        return 0.1
    try:
        value = eval(answer, {"__builtins__": None}, {})  # noqa: S307
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError, OverflowError):
        return 0.1
    return 1.0 if abs(float(value) - truth["target"]) < 1e-5 else 0.1


def test_countdown_scores_equal_tinyzeros_eval_on_arithmetic_answers():
    """A sweep of + - * / answers (some malformed, some with a wrong number) scores as TinyZero's eval."""
    rng = random.Random(0)

    def equation(numbers: list[int]) -> str:
        if len(numbers) == 1:
            return str(numbers[0])
        k = rng.randrange(1, len(numbers))
        left, right, op = equation(numbers[:k]), equation(numbers[k:]), rng.choice("+-*/")
        return f"{left} {op} {right}" if rng.random() < 0.5 else f"({left}){op}({right})"

    checked = set()
    for _ in range(3000):
        numbers = [rng.randint(1, 99) for _ in range(rng.randint(2, 5))]
        answer = equation(rng.sample(numbers, len(numbers)))
        if rng.random() < 0.1:
            answer += rng.choice([")", "(", " 7", "*", "-", "/ 0", " . 5"])
        value = countdown.evaluate(answer)
        target = int(value) if value is not None and value == int(value) and rng.random() < 0.7 else 5
        truth = {"target": target, "numbers": numbers if rng.random() < 0.9 else numbers[:-1]}
        expected = _tinyzero_score(answer, truth)
        assert countdown.compute_score(f"Assistant: <answer>{answer}</answer>", truth) == expected, answer
        checked.add(expected)
    assert checked == {0.1, 1.0}


@pytest.mark.parametrize("answer", ["99**98**97", "9**9**9**9", "2**3", "8//3", "(1)(2)", "9" * 300])
def test_countdown_never_evaluates_powers_or_unbounded_answers(answer):
    start = time.monotonic()
    numbers = [int(n) for n in re.findall(r"\d+", answer)]
    assert countdown.evaluate(answer) is None
    assert countdown.compute_score(f"<answer>{answer}</answer>", {"target": 8, "numbers": numbers}) == 0.1
    assert time.monotonic() - start < 0.1


def test_unknown_source_and_registration(monkeypatch):
    monkeypatch.setattr(registry, "_REWARDS", dict(registry._REWARDS))  # keep the registration local
    assert {"openai/gsm8k", "lighteval/MATH", "countdown", "megarl/digits_sort"} <= set(known_data_sources())
    with pytest.raises(UnknownDataSource, match="no rule reward for data_source 'my/data'"):
        default_compute_score("my/data", "x", "y")

    @register_reward("tests/always_half")
    def half(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5

    assert default_compute_score("tests/always_half", "x", "y") == 0.5
