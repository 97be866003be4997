"""RL estimators and losses as pure tensor functions (no torch.distributed, no Megatron).

`aggregate` reduces token tensors to a loss, `advantages` turns rewards into advantages (the newer
group estimators live in `group_advantages`, on the float64 group statistics of `groups` and the
per-token helpers of `tokens`), `pf_ppo` resamples a batch by its scores (PF-PPO), `kl` measures and
controls KL to the reference, `policy_loss` (with `cov_losses` and the shared `loss_terms`) /
`value_loss` are the actor's and critic's objectives, `rollout_correction` weights and masks tokens for
the rollout/trainer mismatch; `estimator_traits` says what each advantage estimator needs (the critic,
groups of samples, Σπ²).

The names below load their module on first use: importing the package (or `estimator_traits`, which
config validation reads) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "ESTIMATORS": "advantages",
    "compute_advantages": "advantages",
    "scores_to_token_rewards": "advantages",
    "gpg": "group_advantages",
    "grpo_passk": "group_advantages",
    "opo": "group_advantages",
    "optimal_token_baseline": "group_advantages",
    "GroupStats": "groups",
    "Groups": "groups",
    "group_stats": "groups",
    "REWEIGHT_METHODS": "pf_ppo",
    "pf_ppo_resample": "pf_ppo",
    "pf_ppo_weights": "pf_ppo",
    "on_tokens": "tokens",
    "returns_to_go": "tokens",
    "zero_padding": "tokens",
    "LOSS_AGG_MODES": "aggregate",
    "aggregate": "aggregate",
    "masked_mean": "aggregate",
    "masked_var": "aggregate",
    "masked_whiten": "aggregate",
    "ESTIMATOR_TRAITS": "estimator_traits",
    "EstimatorTraits": "estimator_traits",
    "KL_CONTROLLERS": "kl",
    "KL_ESTIMATORS": "kl",
    "AdaptiveKLController": "kl",
    "FixedKLController": "kl",
    "KLController": "kl",
    "apply_kl_penalty": "kl",
    "build_kl_controller": "kl",
    "kl_penalty": "kl",
    "clip_cov_loss": "cov_losses",
    "kl_cov_loss": "cov_losses",
    "LOSS_PARAMS": "loss_traits",
    "POLICY_LOSSES": "policy_loss",
    "cispo_loss": "policy_loss",
    "entropy_bonus": "policy_loss",
    "gmpo_loss": "policy_loss",
    "gspo_loss": "policy_loss",
    "ppo_clip_loss": "policy_loss",
    "reinforce_loss": "policy_loss",
    "sapo_loss": "policy_loss",
    "IS_LEVELS": "rollout_correction",
    "RS_LEVELS": "rollout_correction",
    "compute_rollout_correction": "rollout_correction",
    "clipped_value_loss": "value_loss",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
