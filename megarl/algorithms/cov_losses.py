"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models"): policy losses that single out the few tokens whose log-prob and advantage covary most,
the tokens that drive the policy's entropy down, and restrain only those.

The covariance of token t is (A_t − mean A)·(logp_t − mean logp), the means over the masked tokens of
THIS call's batch (a micro-batch in the worker, as in verl). Same signature, metrics and rollout-IS
weighting as the losses in `megarl.algorithms.policy_loss`, which registers both.
"""

from __future__ import annotations

import torch

from megarl.algorithms.aggregate import Count, aggregate, masked_mean
from megarl.algorithms.loss_terms import fraction, loss_metrics, token_ratio, weighted


def clip_cov_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    clip_ratio_c: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    agg_mode: str = "token-mean",
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov: PPO's clipped surrogate (token ratio, log-ratio clamped to ±20, no dual clip), except that
    a few random tokens lose their gradient (their loss is set to 0). The candidates are the masked tokens
    PPO did not clip whose covariance lies in (clip_cov_lb, clip_cov_ub); max(⌊clip_cov_ratio · masked
    tokens⌋, 1) of them are drawn: the first of a random permutation (`torch.randperm` with `generator`)
    of the candidates in row-major order. verl: `compute_policy_loss_clip_cov`, loss_mode "clip_cov",
    keys `actor.policy_loss.clip_cov_ratio` (0.0002), `clip_cov_lb` (1.0), `clip_cov_ub` (5.0).

    "pg_clipfrac" is the fraction of tokens so removed (as in verl); `clip_ratio_c` is ignored.
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio={clip_cov_ratio} must be > 0")
    log_ratio = log_prob - old_log_prob
    ratio = token_ratio(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    real = mask > 0
    cov = _covariance(advantages, log_prob.detach(), mask)
    candidates = real & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    index = candidates.flatten().nonzero().squeeze(-1)
    count = max(int(clip_cov_ratio * real.sum().item()), 1)
    device = generator.device if generator is not None else "cpu"
    order = torch.randperm(index.numel(), generator=generator, device=device).to(index.device)
    removed = torch.zeros_like(real).flatten()
    removed[index[order[:count]]] = True
    removed = removed.view_as(real)
    losses = torch.where(removed, 0.0, torch.maximum(unclipped, clipped))
    loss = aggregate(weighted(losses, rollout_is_weights, mask), mask, agg_mode, **agg_counts)
    return loss, loss_metrics(log_ratio, mask, fraction(removed, mask))


def kl_cov_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    *,
    clip_ratio_c: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    agg_mode: str = "token-mean",
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov: the unclipped surrogate −A·r per token (r = exp(logp − old), log-ratio clamped to ±20),
    plus ppo_kl_coef·|logp − old| on the max(⌊kl_cov_ratio · masked tokens⌋, 1) masked tokens of largest
    covariance. verl: `compute_policy_loss_kl_cov`, loss_mode "kl_cov", keys
    `actor.policy_loss.kl_cov_ratio` (0.0002) and `ppo_kl_coef` (0.1).

    The clip arguments are ignored and both clip fractions are 0; "ppo_kl" is the usual masked mean of
    old − logp (verl logs the mean of |logp − old| under that name for this loss).
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio={kl_cov_ratio} must be > 0")
    log_ratio = log_prob - old_log_prob
    losses = -advantages * token_ratio(log_ratio)
    real = mask > 0
    index = real.flatten().nonzero().squeeze(-1)
    if index.numel():
        cov = _covariance(advantages, log_prob.detach(), mask).flatten()[index]
        count = max(int(index.numel() * kl_cov_ratio), 1)
        penalised = torch.zeros_like(real).flatten()
        penalised[index[torch.topk(cov, count).indices]] = True
        losses = torch.where(penalised.view_as(real), losses + ppo_kl_coef * log_ratio.abs(), losses)
    loss = aggregate(weighted(losses, rollout_is_weights, mask), mask, agg_mode, **agg_counts)
    return loss, loss_metrics(log_ratio, mask)


def _covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))
