"""KL(policy ‖ reference) per token, the in-reward KL penalty and its coefficient controllers.

The estimators are verl's `kl_penalty` vocabulary (`algorithm.kl_penalty`, `actor.kl_loss_type`), after
John Schulman's "Approximating KL divergence" note, on samples of the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from megarl.algorithms.aggregate import masked_mean


def _k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return log_prob - ref_log_prob


def _k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    # the log-ratio is bounded first so exp cannot overflow (an inf would turn the gradient into nan)
    log_ratio = torch.clamp(ref_log_prob - log_prob, -20, 20)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -10, 10)


def _k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_prob - ref_log_prob) ** 2


_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
    "kl": _k1,
    "mse": _k2,
    "abs": lambda log_prob, ref: (log_prob - ref).abs(),
}
KL_ESTIMATORS = (*_ESTIMATORS, *(f"{name}+" for name in _ESTIMATORS))
KL_CONTROLLERS = ("fixed", "adaptive")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate from the sampled tokens' log-probs under the policy and the reference.

    "k1" = "kl" = logp − ref; "abs" = |logp − ref|; "k2" = "mse" = ½ (logp − ref)²; "k3" = "low_var_kl" =
    exp(ref − logp) − (ref − logp) − 1 with ref − logp clamped to ±20 and the result to [−10, 10]
    (verl's clamped k3). A "+" suffix (e.g. "k3+") keeps the value of the named estimator but takes the
    gradient of k2, logp − ref, whose expectation is the gradient of KL: k2 − sg(k2) + sg(value), verl's
    straight-through rule ("k2+" / "mse+" are plain k2). verl's "full" (needs all logits) is not offered.
    """
    base = estimator[:-1] if estimator.endswith("+") else estimator
    if base not in _ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; use one of {', '.join(KL_ESTIMATORS)}")
    value = _ESTIMATORS[base](log_prob, ref_log_prob)
    if base == estimator or _ESTIMATORS[base] is _k2:
        return value
    k2 = _k2(log_prob, ref_log_prob)
    return k2 - k2.detach() + value.detach()


def apply_kl_penalty(
    token_rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_rewards − coef·kl on the masked tokens, the batch's KL): the KL is the mean over sequences
    of each sequence's token-mean KL, as verl measures it (sequences without tokens are left out, where
    verl counts them as 0) — what the adaptive controller's `update` expects and `kl/mean` logs.
    """
    penalty = torch.where(mask > 0, coef * kl, 0.0)
    per_sequence = masked_mean(kl, mask, dim=-1)
    has_tokens = (mask > 0).any(dim=-1)
    return token_rewards - penalty, masked_mean(per_sequence, has_tokens).detach()


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
