"""Rule rewards by `data_source`, under verl's names, and verl's `default_compute_score` entry.

A user's reward file that falls back to verl's `default_compute_score` for some rows imports megarl's
under that name: `from megarl.rewards import default_compute_score` (same call; docs/verl-rewards.md).
verl's sources scored here: openai/gsm8k; lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,
HuggingFaceH4/MATH-500; math_dapo, math, math_dapo_reasoning, aime*; codecontests, apps, codeforces, taco;
searchR1_*; numina_* (verl's prime_math) and hiyouga/geometry3k (verl's geo3k, mathruler).

Every reward function has verl's signature, `fn(data_source, solution_str, ground_truth, extra_info=None)
-> float | dict`. `register_reward("my/source")` adds one; `reward_for(data_source)` finds one (exact
name first, then the name patterns verl and TinyZero match: any name containing "countdown").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from megarl.errors import EXIT_USAGE, MegarlError
from megarl.rewards import (
    calc_tool,
    code_tests,
    countdown,
    digits,
    gsm8k,
    math_boxed,
    math_dapo,
    numina,
    qa_em,
)

RewardFn = Callable[..., float | dict[str, Any]]

_REWARDS: dict[str, RewardFn] = {}


class UnknownDataSource(MegarlError, KeyError):
    """No rule reward is registered for a data_source."""

    exit_code = EXIT_USAGE

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0])


def register_reward(*data_sources: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: score rows of these data_sources with the decorated function (verl's signature)."""

    def add(fn: RewardFn) -> RewardFn:
        for name in data_sources:
            _REWARDS[name] = fn
        return fn

    return add


def known_data_sources() -> list[str]:
    """The registered data_source names, sorted (plus any name starting with "aime" or containing
    "countdown")."""
    return sorted(_REWARDS)


def reward_for(data_source: str) -> RewardFn | None:
    return _lookup(_REWARDS, data_source)


def _lookup(rules: dict[str, RewardFn], data_source: str) -> RewardFn | None:
    """Exact name first, then verl's prefixes (aime*) and TinyZero's pattern (any name with "countdown")."""
    if data_source in rules:
        return rules[data_source]
    if data_source.startswith("aime"):
        return rules.get("math_dapo")
    if "countdown" in data_source:
        return rules.get("countdown")
    return None


class RuleRewards:
    """`default_compute_score` over the rules registered when it is made: what reward worker processes
    get (pickled), so that a rule registered in the driver's Python scores there too."""

    def __init__(self) -> None:
        self.rules = dict(_REWARDS)

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
    ) -> float | dict[str, Any]:
        fn = _lookup(self.rules, data_source)
        if fn is None:
            raise UnknownDataSource(f"no rule reward for data_source {data_source!r}")
        return fn(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
        )


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float | dict[str, Any]:
    """The rule reward of one response (verl's entry, for custom functions that fall back to it)."""
    fn = reward_for(data_source)
    if fn is None:
        raise UnknownDataSource(f"no rule reward for data_source {data_source!r}")
    return fn(
        data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info
    )


def _truth(ground_truth: Any, data_source: str) -> Any:
    """The row's ground truth; a row without one fails (counted in reward/errors) instead of being
    compared with the text "None"."""
    if ground_truth is None:
        raise ValueError(
            f"the row has no ground truth (reward_model.ground_truth), which the {data_source!r} rule reward "
            "compares the answer with; give every row one (megarl's data loading skips such rows)"
        )
    return ground_truth


@register_reward("openai/gsm8k")
def _gsm8k(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    return gsm8k.compute_score(solution_str, _truth(ground_truth, data_source))


@register_reward("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def _math(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    return math_boxed.compute_score(solution_str, _truth(ground_truth, data_source))


@register_reward("countdown")
def _countdown(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    return countdown.compute_score(solution_str, _truth(ground_truth, data_source))


@register_reward("calc_tool")
def _calc_tool(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    return calc_tool.compute_score(solution_str, _truth(ground_truth, data_source))


@register_reward("megarl/digits_sort", "megarl/digits_reverse", "megarl/digits_add", "megarl/digits_count")
def _digits(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    return digits.compute_score(solution_str, _truth(ground_truth, data_source))


@register_reward("math_dapo", "math", "math_dapo_reasoning")  # and any name starting with "aime"
def _math_dapo(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    return math_dapo.compute_score(solution_str, str(_truth(ground_truth, data_source)))


@register_reward("codecontests", "apps", "codeforces", "taco")
def _code(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    return code_tests.compute_score(solution_str, _truth(ground_truth, data_source))


SEARCH_R1_SOURCES = tuple(
    f"searchR1_{name}"
    for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
)


@register_reward(*SEARCH_R1_SOURCES)
def _search_r1(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    return qa_em.compute_score(solution_str, _truth(ground_truth, data_source))


@register_reward(*numina.NUMINA_SOURCES)
def _numina(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    return numina.numina_score(str(solution_str), str(_truth(ground_truth, data_source)))


@register_reward("hiyouga/geometry3k")
def _geometry3k(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    return numina.geometry3k_score(solution_str, _truth(ground_truth, data_source))
