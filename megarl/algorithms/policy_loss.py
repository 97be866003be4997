"""Policy-gradient losses of the actor, one pure function each, and the entropy bonus.

Every loss has the signature

    loss(log_prob, old_log_prob, advantages, mask, clip_low, clip_high, *, clip_ratio_c=None,
         rollout_is_weights=None, agg_mode="token-mean", <its own keyword parameters>, **agg_counts)
        -> (loss, metrics)

`log_prob` (with grad) and `old_log_prob` are the sampled tokens' log-probs under the current policy and
under the policy that generated them (as recomputed by the trainer); `advantages`, the response `mask` and
`rollout_is_weights` are [batch, response_len] too. `rollout_is_weights` (train/rollout mismatch
correction, `megarl.algorithms.rollout_correction`; detached) multiply the per-token losses before they
are aggregated, as in verl. `agg_mode` and `**agg_counts` (num_tokens, num_seqs, horizon) go to
`megarl.algorithms.aggregate.aggregate`; pass the mini-batch's global counts when the batch is split.
`clip_ratio_c` (dual clip) is honoured by "vanilla" only; the other losses accept and ignore it.

`loss` is the scalar to minimise; `metrics` are detached scalars, the same three for every loss:
"pg_clipfrac", "pg_clipfrac_lower" (0 where a loss has no such notion) and "ppo_kl" (masked mean of
old − logp).

`POLICY_LOSSES` maps verl's names (`actor.policy_loss.loss_mode`) to the functions; the torch-free
`loss_traits.LOSS_PARAMS` maps each name to the loss's own parameters and their verl defaults (parameter
name = verl config key). The covariance-based losses live in `megarl.algorithms.cov_losses`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from megarl.algorithms.aggregate import Count, aggregate, masked_mean
from megarl.algorithms.cov_losses import clip_cov_loss, kl_cov_loss
from megarl.algorithms.loss_terms import (
    MAX_LOG_RATIO,
    clipped_surrogate,
    fraction,
    loss_metrics,
    token_ratio,
    weighted,
)

Metrics = dict[str, torch.Tensor]

# verl bounds GSPO's log-ratio above only, at 10 (exp(10) ≈ 2.2e4); below it underflows harmlessly to 0
_GSPO_MAX_LOG_RATIO = 10.0


def ppo_clip_loss(
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
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO's clipped surrogate (Schulman et al. 2017) with the token ratio r = exp(logp − old), the
    log-ratio clamped to ±20: per token max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high)) (separate
    bounds = DAPO's "clip-higher"). verl: `compute_policy_loss_vanilla`, loss_mode "vanilla".

    Dual clip (Ye et al. 2020) when `clip_ratio_c` (> 1) is given: for A < 0 the token loss is also capped
    at −A·clip_ratio_c. "pg_clipfrac" counts tokens where the clipped branch is taken,
    "pg_clipfrac_lower" those where the dual-clip cap is.
    """
    log_ratio = log_prob - old_log_prob
    losses, clip_metrics = clipped_surrogate(
        token_ratio(log_ratio), advantages, mask, clip_low, clip_high, clip_ratio_c
    )
    loss = aggregate(weighted(losses, rollout_is_weights, mask), mask, agg_mode, **agg_counts)
    return loss, loss_metrics(log_ratio, mask, **clip_metrics)


def gspo_loss(
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
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", the GSPO-token form): PPO's clipped
    surrogate with the sequence ratio s_i = exp(mean over the sequence's tokens of (logp − old)) in place
    of the token ratio. verl: `compute_policy_loss_gspo`, loss_mode "gspo".

    Each token's ratio is sg(s_i)·exp(logp − sg(logp)): its value is s_i, its gradient flows through its
    own log-prob; its log is bounded above at 10 as in verl. With advantages constant over a sequence and
    agg_mode="seq-mean-token-mean" this is the paper's sequence-level objective and gradient. verl always
    aggregates GSPO with "seq-mean-token-mean" whatever `loss_agg_mode` says; here `agg_mode` is honoured,
    so pick that mode in the config. There is no dual clip: `clip_ratio_c` is ignored (verl too).
    """
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(log_ratio.detach(), mask, dim=-1)
    token_log_ratio = seq_log_ratio[:, None] + log_prob - log_prob.detach()
    ratio = torch.exp(torch.clamp(token_log_ratio, max=_GSPO_MAX_LOG_RATIO))
    losses, clip_metrics = clipped_surrogate(ratio, advantages, mask, clip_low, clip_high, None)
    loss = aggregate(weighted(losses, rollout_is_weights, mask), mask, agg_mode, **agg_counts)
    return loss, loss_metrics(log_ratio, mask, clip_metrics["pg_clipfrac"])


def cispo_loss(
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
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, MiniMax 2025, "Scaling Test-Time Compute Efficiently with Lightning
    Attention"): per token −sg(clip(r, 1 − clip_low, 1 + clip_high))·A·logp, r = exp(logp − old) (log-ratio
    clamped to ±20). The IS weight is clipped but, unlike PPO, no token loses its gradient: each gets
    −sg(clip(r))·A. verl: `compute_policy_loss_cispo`, loss_mode "cispo"; its bounds are the actor's
    clip_ratio_low / clip_ratio_high (MiniMax bounds only the upper side: give a large clip_low for that).

    "pg_clipfrac" counts tokens whose IS weight was clipped; `clip_ratio_c` is ignored.
    """
    log_ratio = log_prob - old_log_prob
    ratio = token_ratio(log_ratio)
    is_weight = torch.clamp(ratio, 1 - clip_low, 1 + clip_high).detach()
    losses = -is_weight * advantages * log_prob
    loss = aggregate(weighted(losses, rollout_is_weights, mask), mask, agg_mode, **agg_counts)
    return loss, loss_metrics(log_ratio, mask, fraction(ratio != is_weight, mask))


def sapo_loss(
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
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", Qwen): the hard clip replaced by a
    sigmoid gate. Per token −A·f(r, τ) with f(r, τ) = σ(τ·(r − 1))·4/τ, r = exp(logp − old) (log-ratio
    clamped to ±20), τ = tau_pos where A > 0 and tau_neg where A ≤ 0. The gradient −A·4σ(1 − σ)·r equals
    PPO's −A·r at r = 1 and fades smoothly as r leaves 1. verl: `compute_policy_loss_sapo`, loss_mode
    "sapo", temperatures `actor.tau_pos` (default 1.0) and `actor.tau_neg` (1.05).

    verl always aggregates SAPO with "seq-mean-token-mean"; here `agg_mode` is honoured. `clip_low`,
    `clip_high` and `clip_ratio_c` are ignored; both clip fractions are 0.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures tau_pos={tau_pos}, tau_neg={tau_neg} must both be > 0")
    log_ratio = log_prob - old_log_prob
    ratio = token_ratio(log_ratio)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    losses = -advantages * torch.sigmoid(tau * (ratio - 1)) * (4 / tau)
    loss = aggregate(weighted(losses, rollout_is_weights, mask), mask, agg_mode, **agg_counts)
    return loss, loss_metrics(log_ratio, mask)


def reinforce_loss(
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
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, Metrics]:
    """The plain policy gradient (REINFORCE, Williams 1992): per token −w·A·logp, w = `rollout_is_weights`
    (1 without them), no ratio and no clipping. Registered twice: "reinforce" is verl's
    `compute_policy_loss_reinforce` (bypass mode, `algorithm.rollout_correction.loss_type=reinforce`) and
    "gpg" verl's `compute_policy_loss_gpg` (GPG, Chu et al. 2025, "GPG: A Simple and Strong Reinforcement
    Learning Baseline for Model Reasoning"), the same token loss.

    In verl's bypass mode old_log_prob is the rollout's and w = min(π_θ/π_rollout, threshold) comes from
    the current log_prob; to reproduce it pass the weights of
    `compute_rollout_correction(log_prob.detach(), old_log_prob, mask, is_level=...)`. `old_log_prob` only
    feeds "ppo_kl"; the clip arguments are ignored.
    """
    losses = -advantages * log_prob
    loss = aggregate(weighted(losses, rollout_is_weights, mask), mask, agg_mode, **agg_counts)
    return loss, loss_metrics(log_prob - old_log_prob, mask)


def gmpo_loss(
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
    **agg_counts: Count | None,
) -> tuple[torch.Tensor, Metrics]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): the token ratios of a sequence
    combined by their geometric mean. Per sequence i with n_i tokens,

        loss_i = −Â_i · exp((1/n_i) Σ_t ℓ_t),   Â_i = (1/n_i) Σ_t A_t,

    where ℓ_t = logp − old clipped in LOG space on one side: at most clip_high where A_t > 0, at least
    −clip_low where A_t < 0, and 0 where A_t = 0. The loss is the mean of loss_i over the sequences
    (Σ_i loss_i / num_seqs, num_seqs counting the sequences with tokens as the seq-mean modes do; verl
    takes torch.mean over every row; `agg_mode` is ignored, as in verl). With `rollout_is_weights`, loss_i is
    multiplied by the geometric mean of its tokens' weights (weights floored at 1e-10).
    verl: `compute_policy_loss_geo_mean`, loss_mode "geo_mean"; the bounds are the actor's clip_ratio_low /
    clip_ratio_high read as log-ratios (the paper uses 0.4 for both, i.e. ratios in (e^−0.4, e^0.4)).
    verl adds 1e-8 to n_i and 1e-10 to the weights before the log and does not bound the mean log-ratio;
    this divides exactly and clamps the mean log-ratio to ±20.

    "pg_clipfrac" / "pg_clipfrac_lower": tokens with logp − old outside [−clip_low, clip_high] and A > 0
    / A < 0. `clip_ratio_c` is ignored.
    """
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    bounded = torch.clamp(log_ratio, -clip_low, clip_high)
    # bounded only on the side the advantage pushes the ratio towards, like PPO's clip
    one_sided = sign * torch.minimum(sign * log_ratio, sign * bounded)
    seq_log_ratio = torch.clamp(masked_mean(one_sided, mask, dim=-1), -MAX_LOG_RATIO, MAX_LOG_RATIO)
    per_seq = -masked_mean(advantages, mask, dim=-1) * torch.exp(seq_log_ratio)
    if rollout_is_weights is not None:
        log_weights = torch.log(rollout_is_weights.detach().to(per_seq.dtype).clamp_min(1e-10))
        per_seq = per_seq * torch.exp(masked_mean(log_weights, mask, dim=-1))
    has_tokens = (mask > 0).any(dim=-1, keepdim=True)
    loss = aggregate(per_seq[:, None], has_tokens, "seq-mean-token-sum", num_seqs=agg_counts.get("num_seqs"))
    outside = log_ratio != bounded
    return loss, loss_metrics(
        log_ratio,
        mask,
        fraction(outside & (advantages > 0), mask),
        fraction(outside & (advantages < 0), mask),
    )


PolicyLossFn = Callable[..., tuple[torch.Tensor, Metrics]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "vanilla": ppo_clip_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "gpg": reinforce_loss,
    "reinforce": reinforce_loss,
    "geo_mean": gmpo_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, coef: float, agg_mode: str, **agg_counts: Count | None
) -> torch.Tensor:
    """coef × the aggregated token entropy [batch, len]: the scalar to SUBTRACT from the policy loss."""
    return coef * aggregate(entropy, mask, agg_mode, **agg_counts)
