"""Rewards: rule rewards by `data_source` (verl's names), user reward files, reward-model scores and
DAPO's overlong penalty and dynamic-sampling filter, combined by `RewardComputer` into one number per response.

Reward functions run in reward worker processes (`megarl.rewards.pool`), which import this package for
the rule rewards: its names load on first use, so a worker imports neither torch nor transformers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "RewardComputer": "megarl.rewards.computer",
    "RewardError": "megarl.rewards.custom",
    "RewardFunctionError": "megarl.rewards.custom",
    "load_reward_function": "megarl.rewards.custom",
    "varied_groups": "megarl.rewards.dynamic_sampling",
    "overlong_penalty": "megarl.rewards.overlong",
    "UnknownDataSource": "megarl.rewards.registry",
    "default_compute_score": "megarl.rewards.registry",
    "known_data_sources": "megarl.rewards.registry",
    "register_reward": "megarl.rewards.registry",
    "reward_for": "megarl.rewards.registry",
}

__all__ = [
    "RewardComputer",
    "RewardError",
    "RewardFunctionError",
    "UnknownDataSource",
    "default_compute_score",
    "known_data_sources",
    "load_reward_function",
    "overlong_penalty",
    "register_reward",
    "reward_for",
    "varied_groups",
]

if TYPE_CHECKING:
    from megarl.rewards.computer import RewardComputer
    from megarl.rewards.custom import RewardError, RewardFunctionError, load_reward_function
    from megarl.rewards.dynamic_sampling import varied_groups
    from megarl.rewards.overlong import overlong_penalty
    from megarl.rewards.registry import (
        UnknownDataSource,
        default_compute_score,
        known_data_sources,
        register_reward,
        reward_for,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'megarl.rewards' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value
