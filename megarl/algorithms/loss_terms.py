"""Pieces the policy losses share: the bounded token ratio, PPO's clipped surrogate, rollout-IS weighting of
token losses and the metrics every loss reports. Tensors are [batch, response_len] with a response `mask`.
"""

from __future__ import annotations

import torch

from megarl.algorithms.aggregate import masked_mean

# exp() of a log-ratio beyond this would overflow or swamp the loss (verl clamps at the same ±20)
MAX_LOG_RATIO = 20.0


def token_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(log_ratio) with the log-ratio clamped to ±MAX_LOG_RATIO (no gradient beyond the clamp)."""
    return torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high)), capped at −A·clip_ratio_c for A < 0
    when `clip_ratio_c` is given, with the "pg_clipfrac" / "pg_clipfrac_lower" metrics."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    metrics = {"pg_clipfrac": fraction(clipped > unclipped, mask)}
    if clip_ratio_c is None:
        metrics["pg_clipfrac_lower"] = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        return losses, metrics
    if clip_ratio_c <= 1:
        raise ValueError(
            f"clip_ratio_c={clip_ratio_c} must be > 1 (dual clip caps the loss at -A·clip_ratio_c)"
        )
    cap = -advantages * clip_ratio_c
    capped = (advantages < 0) & (losses > cap)
    metrics["pg_clipfrac_lower"] = fraction(capped, mask)
    return torch.where(capped, cap, losses), metrics


def weighted(
    losses: torch.Tensor, rollout_is_weights: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """Token losses times the (detached) rollout-IS weights; padding weights are ignored, even nan ones."""
    if rollout_is_weights is None:
        return losses
    return losses * torch.where(mask > 0, rollout_is_weights.detach().to(losses.dtype), 0.0)


def fraction(flags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached masked fraction of the tokens where `flags` is true."""
    dtype = mask.dtype if mask.is_floating_point() else torch.get_default_dtype()
    return masked_mean(flags.to(dtype), mask).detach()


def loss_metrics(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    pg_clipfrac: torch.Tensor | None = None,
    pg_clipfrac_lower: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The metrics every loss returns: "ppo_kl" (masked mean of old − logp, unclamped) and the two clip
    fractions (0 for a loss that does not clip)."""
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    return {
        "pg_clipfrac": zero if pg_clipfrac is None else pg_clipfrac,
        "pg_clipfrac_lower": zero if pg_clipfrac_lower is None else pg_clipfrac_lower,
        "ppo_kl": masked_mean(-log_ratio.detach(), mask).detach(),
    }
