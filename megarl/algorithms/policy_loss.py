"""Policy-gradient losses: PPO's clipped surrogate (token ratio) and GSPO's (sequence ratio), plus the
entropy bonus.

Each loss takes log-probs of the sampled tokens under the current policy (`log_prob`, with grad) and the
policy that generated them (`old_log_prob`), per-token `advantages` and the response `mask`, all
[batch, response_len], and returns `(loss, metrics)`: the aggregated scalar to minimise and detached
scalar tensors for logging. `agg_mode` and `**agg_counts` (num_tokens, num_seqs, horizon) go to
`megarl.algorithms.aggregate.aggregate`; pass the mini-batch's global counts when the batch is split.
"""

from __future__ import annotations

import torch

from megarl.algorithms.aggregate import Count, aggregate, masked_mean

# exp() of a log-ratio beyond this would overflow or swamp the loss; clipping makes the value moot anyway
_MAX_LOG_RATIO = 20.0


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
    agg_mode: str = "token-mean",
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate with the token ratio r = exp(logp − old):
    per token max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high)) (separate bounds = "clip-higher").

    Dual clip (Ye et al. 2020) when `clip_ratio_c` (> 1) is given: for A < 0 the loss is also capped at
    −A·clip_ratio_c. Metrics: "pg_clipfrac" (masked fraction of tokens where the clipped branch is taken),
    "pg_clipfrac_lower" (where the dual-clip cap is taken), "ppo_kl" (masked mean of old − logp).
    """
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(torch.clamp(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    losses, metrics = _clipped_surrogate(ratio, advantages, mask, clip_low, clip_high, clip_ratio_c)
    metrics["ppo_kl"] = masked_mean(-log_ratio, mask).detach()
    return aggregate(losses, mask, agg_mode, **agg_counts), metrics


def gspo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
    agg_mode: str = "token-mean",
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025, "GSPO-token"): the clipped surrogate of `ppo_clip_loss` with the sequence
    ratio s_i = exp(mean over the sequence's tokens of (logp − old)) in place of the token ratio.

    Each token's ratio is sg(s_i)·exp(logp − sg(logp)): its value is s_i, its gradient flows through its
    own log-prob. With advantages constant over a sequence and agg_mode="seq-mean-token-mean", this is
    the paper's sequence-level objective and gradient. Same metrics as `ppo_clip_loss`.
    """
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(log_ratio.detach(), mask, dim=-1)
    seq_log_ratio = torch.clamp(seq_log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(seq_log_ratio[:, None] + log_prob - log_prob.detach())
    losses, metrics = _clipped_surrogate(ratio, advantages, mask, clip_low, clip_high, clip_ratio_c)
    metrics["ppo_kl"] = masked_mean(-log_ratio, mask).detach()
    return aggregate(losses, mask, agg_mode, **agg_counts), metrics


POLICY_LOSSES = {"vanilla": ppo_clip_loss, "gspo": gspo_loss}


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, coef: float, agg_mode: str, **agg_counts: Count | None
) -> torch.Tensor:
    """coef × the aggregated token entropy [batch, len]: the scalar to SUBTRACT from the policy loss."""
    return coef * aggregate(entropy, mask, agg_mode, **agg_counts)


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    metrics = {"pg_clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), mask).detach()}
    if clip_ratio_c is None:
        metrics["pg_clipfrac_lower"] = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        return losses, metrics
    if clip_ratio_c <= 1:
        raise ValueError(
            f"clip_ratio_c={clip_ratio_c} must be > 1 (dual clip caps the loss at -A·clip_ratio_c)"
        )
    cap = -advantages * clip_ratio_c
    capped = (advantages < 0) & (losses > cap)
    metrics["pg_clipfrac_lower"] = masked_mean(capped.to(ratio.dtype), mask).detach()
    return torch.where(capped, cap, losses), metrics
