"""NaN and inf are refused for every float key of the schema, at load, naming the key (not a neighbour
whose rule the NaN broke)."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from megarl.config import ConfigError, MegarlConfig, load_config

pytestmark = pytest.mark.unit


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, check_paths=False)
    return info.value.problems


def _scalar_float_keys(cls: type = MegarlConfig, prefix: str = "") -> list[str]:
    """Every `float` / `float | None` key of the schema, read from its type hints."""
    keys = []
    for name, tp in typing.get_type_hints(cls).items():
        optional = typing.get_origin(tp) in (typing.Union, types.UnionType)
        inner = [a for a in typing.get_args(tp) if a is not type(None)] if optional else [tp]
        if dataclasses.is_dataclass(inner[0]):
            keys += _scalar_float_keys(inner[0], f"{prefix}{name}.")
        elif inner == [float]:
            keys.append(f"{prefix}{name}")
    return keys


def test_every_float_key_set_to_nan_or_inf_is_named_alone():
    keys = _scalar_float_keys()
    assert "actor.optimizer.lr" in keys and "algorithm.entropy_coeff" in keys and len(keys) > 30
    for bad in ("nan", "inf", "-inf"):
        problems = _problems([f"{key}={bad}" for key in keys])
        assert [p.split("=", 1)[0] for p in problems] == keys
        for key, problem in zip(keys, problems):
            assert problem.startswith(f"{key}={bad} is not a finite number; set a finite value")
        assert (
            problems[keys.index("preference.beta")]
            == f"preference.beta={bad} is not a finite number; set a finite value or null"
        )


ISSUE_CASES = [
    (
        "actor.optimizer.lr=nan",  # was blamed on min_lr
        "actor.optimizer.lr=nan is not a finite number; set a finite value, e.g. actor.optimizer.lr=1e-06",
    ),
    (
        "algorithm.kl_loss_coef=nan",  # was accepted; the run stopped after 3 bad steps
        "algorithm.kl_loss_coef=nan is not a finite number; set a finite value, e.g. algorithm.kl_loss_coef=0.001",
    ),
    (
        "algorithm.entropy_coeff=nan",
        "algorithm.entropy_coeff=nan is not a finite number; set a finite value, e.g. algorithm.entropy_coeff=0.0",
    ),
    (
        "rollout.temperature=inf",  # was accepted (0 is greedy, negative was already refused)
        "rollout.temperature=inf is not a finite number; set a finite value, e.g. rollout.temperature=1.0",
    ),
    (
        "trainer.worker_timeout_s=inf",  # would overflow the process groups' timedelta
        "trainer.worker_timeout_s=inf is not a finite number; set a finite value, e.g. "
        "trainer.worker_timeout_s=1800.0",
    ),
    (
        "actor.optimizer.betas=[0.9,nan]",
        "actor.optimizer.betas=[0.9, nan] holds nan: every item must be a finite number; e.g. "
        "actor.optimizer.betas=[0.9, 0.999]",
    ),
    (
        "reward.weights.rm=nan",
        "reward.weights.rm=nan is not a finite number; set a finite value or remove it",
    ),
    (
        "algorithm.policy_loss_params.clip_cov_lb=inf",
        "algorithm.policy_loss_params.clip_cov_lb=inf is not a finite number; set a finite value or remove it",
    ),
]


@pytest.mark.parametrize(("override", "message"), ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
def test_a_non_finite_value_is_the_only_problem_reported(override, message):
    assert _problems([override]) == [message]


def test_a_nan_set_in_python_is_reported_with_the_bad_choices():
    from megarl.config import validate

    cfg = load_config(None, [], check_paths=False)
    cfg.algorithm.kl_coef = float("nan")
    cfg.algorithm.name = "dpoo"  # type: ignore[assignment]
    with pytest.raises(ConfigError) as info:
        validate(cfg, check_paths=False)
    assert info.value.problems == [
        "algorithm.kl_coef=nan is not a finite number; set a finite value, e.g. algorithm.kl_coef=0.001",
        "algorithm.name='dpoo', which is not allowed; use one of ppo, grpo, sft, dpo, ipo, kto, orpo, simpo, rm",
    ]
