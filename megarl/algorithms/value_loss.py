"""The critic's loss: squared error to the returns, with PPO's clipping of the value update."""

from __future__ import annotations

import torch

from megarl.algorithms.aggregate import Count, aggregate, masked_mean


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg_mode: str = "token-mean",
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per token ½·max((v − R)², (old + clamp(v − old, −clip, clip) − R)²), aggregated like the policy loss.

    `values` [batch, len] are the critic's current predictions (with grad), `old_values` those it made
    when the rollouts were scored, `returns` the targets. Metrics: "vf_clipfrac" (masked fraction of
    tokens where the clipped error is the larger) and "vpred_mean" (masked mean of `values`).
    """
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(error, clipped_error), mask, agg_mode, **agg_counts)
    metrics = {
        "vf_clipfrac": masked_mean((clipped_error > error).to(values.dtype), mask).detach(),
        "vpred_mean": masked_mean(values, mask).detach(),
    }
    return loss, metrics
