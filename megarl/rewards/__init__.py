"""Rewards: rule rewards by `data_source` (verl's names), user reward files, reward-model scores and
DAPO's overlong penalty and dynamic-sampling filter, combined by `RewardComputer` into one number per response."""

from megarl.rewards.computer import RewardComputer
from megarl.rewards.custom import RewardError, load_reward_function
from megarl.rewards.dynamic_sampling import varied_groups
from megarl.rewards.overlong import overlong_penalty
from megarl.rewards.registry import (
    UnknownDataSource,
    default_compute_score,
    known_data_sources,
    register_reward,
    reward_for,
)

__all__ = [
    "RewardComputer",
    "RewardError",
    "UnknownDataSource",
    "default_compute_score",
    "known_data_sources",
    "load_reward_function",
    "overlong_penalty",
    "register_reward",
    "reward_for",
    "varied_groups",
]
