"""KL(policy ‖ reference) per token, the in-reward KL penalty and its coefficient controllers.

The estimators follow John Schulman's "Approximating KL divergence" note (k1, k2, k3) on samples of the
policy; "low_var_kl" is verl's name for k3 clamped to [-10, 10].
"""

from __future__ import annotations

from typing import Any

import torch

from megarl.algorithms.aggregate import masked_mean

KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
KL_CONTROLLERS = ("fixed", "adaptive")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate from the sampled tokens' log-probs under the policy and the reference.

    "k1" = logp − ref; "k2" = ½ (logp − ref)²; "k3" = exp(ref − logp) − (ref − logp) − 1 (unbiased, ≥ 0);
    "low_var_kl" = k3 clamped to [-10, 10].
    """
    if estimator == "k1":
        return log_prob - ref_log_prob
    if estimator == "k2":
        return 0.5 * (log_prob - ref_log_prob) ** 2
    if estimator == "k3":
        log_ratio = ref_log_prob - log_prob
        return torch.exp(log_ratio) - log_ratio - 1
    if estimator == "low_var_kl":
        # the log-ratio is bounded first so exp cannot overflow (an inf would turn the gradient into nan)
        log_ratio = torch.clamp(ref_log_prob - log_prob, -20, 20)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -10, 10)
    raise ValueError(f"unknown KL estimator {estimator!r}; use one of {', '.join(KL_ESTIMATORS)}")


def apply_kl_penalty(
    token_rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_rewards − coef·kl on the masked tokens, mean KL over the masked tokens).

    The mean KL is what the adaptive controller's `update` expects.
    """
    penalty = torch.where(mask > 0, coef * kl, 0.0)
    return token_rewards - penalty, masked_mean(kl, mask).detach()


class KLController:
    """The KL coefficient (`.value`) and how it changes between steps; saved with the checkpoint."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Adapt `value` to the KL measured over the last `n_steps` samples (no-op by default)."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class FixedKLController(KLController):
    """A constant KL coefficient."""


class AdaptiveKLController(KLController):
    """The KL coefficient of Ziegler et al. (2019), steered so the measured KL approaches `target_kl`.

    After each step: error = clip(current_kl / target_kl − 1, −0.2, 0.2), and the coefficient is
    multiplied by 1 + error · n_steps / horizon (n_steps = samples in the step).
    """

    def __init__(self, init_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl={target_kl} and horizon={horizon} must both be > 0")
        super().__init__(init_coef)
        self.target_kl = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target_kl - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon


def build_kl_controller(kind: str, coef: float, target_kl: float = 0.1, horizon: int = 10000) -> KLController:
    """The controller named by `algorithm.kl_ctrl` ("fixed" | "adaptive"), starting at `coef`."""
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        return AdaptiveKLController(coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; use one of {', '.join(KL_CONTROLLERS)}")
