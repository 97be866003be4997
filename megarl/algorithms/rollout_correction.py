"""Rollout correction: importance weights and rejection masks for the mismatch between the policy that
sampled a batch in the rollout engine (`rollout_log_prob`, e.g. vLLM in bf16) and the same weights as the
trainer computes them (`old_log_prob`).

verl's `rollout_corr_helper.compute_rollout_correction_and_rejection_mask` with its
`algorithm.rollout_correction` keys (Liu et al. 2025, "When Speed Kills Stability: Demystifying RL
Collapse from the Training-Inference Mismatch"). The log-ratio of token t is ρ_t = old − rollout; every
exp() of it is taken after clamping to ±20, as in verl. The weights go to a policy loss's
`rollout_is_weights`, the new mask replaces the response mask of the loss.
"""

from __future__ import annotations

import math

import torch

from megarl.algorithms.aggregate import masked_mean

IS_LEVELS = ("token", "sequence")
# verl 0.9's k1 names bound the ratio π_rollout/π_train (k1 = rollout − old = −ρ) where the older names
# bound π_train/π_rollout: the same test with the bounds inverted, identical for the default 1/upper
K1_LEVELS = {"token_k1": "token", "seq_sum_k1": "sequence", "seq_mean_k1": "geometric"}
# verl 0.9's divergence rejection: drop where a token's k2 = ρ²/2 or k3 = exp(ρ) − 1 − ρ (ρ clamped to
# ±20), or its sequence's sum / mean / max of it, exceeds rs_threshold
DIVERGENCE_LEVELS = tuple(
    f"{where}_{k}" for where in ("token", "seq_sum", "seq_mean", "seq_max") for k in ("k2", "k3")
)
RS_LEVELS = ("token", "sequence", "geometric", *K1_LEVELS, *DIVERGENCE_LEVELS)

_SAFETY_BOUND = 20.0


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    *,
    is_level: str | None = None,
    is_threshold: float = 2.0,
    is_batch_normalize: bool = False,
    rs_level: str | None = None,
    rs_threshold: float | None = None,
    rs_threshold_lower: float | None = None,
    veto_threshold: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, torch.Tensor]]:
    """(IS weights or None, new mask, metrics) for a batch of [batch, response_len] log-probs and mask.

    Truncated IS (`is_level`, verl `rollout_is`, default None = no weights; `is_threshold`,
    `rollout_is_threshold`, default 2.0 = C):
    - "token": w_t = min(exp(ρ_t), C)
    - "sequence": w_t = min(exp(Σ_t ρ_t), C), one weight per sequence broadcast over its tokens
    Weights are 0 at padding and detached. `is_batch_normalize` (`rollout_is_batch_normalize`, False)
    divides them by their mean (over the masked tokens; over the sequences for "sequence") so it is 1.

    Rejection (masked IS; `rs_level`, verl `rollout_rs`, default None): a token ("token") or a whole
    sequence ("sequence": its ratio exp(Σ_t ρ_t); "geometric": exp(mean_t ρ_t)) is dropped from the mask
    when its ratio lies outside [lower, upper], upper = `rs_threshold` (`rollout_rs_threshold`, required
    with rs_level), lower = `rs_threshold_lower` (`rollout_rs_threshold_lower`, default 1/upper). The test
    is made on log-ratios, so it is exact beyond the ±20 clamp. verl 0.9's names are accepted too:
    "token_k1" / "seq_sum_k1" / "seq_mean_k1" are these three with [lower, upper] bounding the inverse
    ratio π_rollout/π_train, as verl reads them; "{token,seq_sum,seq_mean,seq_max}_{k2,k3}" drop where
    the k2 / k3 divergence (per token, or its sum / mean / max over the sequence) exceeds rs_threshold
    (no lower bound). verl's comma-separated chains of several criteria are not supported.

    Veto (`veto_threshold`, verl `rollout_token_veto_threshold`, default None = off): a sequence with any
    token of exp(ρ_t) < veto_threshold is dropped whole.

    Metrics (detached scalars, verl's names under "rollout_corr/"; fractions and means "over sequences"
    count only the sequences with at least one token, where verl counts every row):
    - with is_level: rollout_is_mean (masked mean of the truncated weights before batch normalisation:
      verl 0.9's rollout_is_mean), rollout_is_raw_mean (the same mean before truncation: what verl 0.8
      logged as rollout_is_mean; log-ratios [ln 3, 0], C=2: 2.0 where rollout_is_mean is 1.5),
      rollout_is_max (largest weight BEFORE truncation), rollout_is_ratio_fraction_high / _low (fraction
      of tokens, or of sequences at sequence level, whose untruncated ratio is > C / < 1/C: high = the
      truncated ones), and rollout_is_batch_norm_factor when normalising;
    - with rs_level: rollout_rs_masked_fraction (tokens dropped, of the masked ones) and
      rollout_rs_seq_masked_fraction (sequences with a dropped token);
    - with veto_threshold: rollout_is_veto_fraction (sequences vetoed) and
      rollout_is_catastrophic_token_fraction (tokens under the veto threshold);
    - always, over the input mask: kl = mean(rollout − old) (k1 of KL(rollout ‖ train)), k3_kl =
      mean(exp(ρ) − ρ − 1), training_ppl / rollout_ppl (mean over sequences of exp(−mean_t log-prob)),
      log_ppl_diff = mean over sequences of (mean_t rollout − mean_t old), ppl_ratio = mean over sequences
      of exp(that) (training / rollout perplexity), chi2_token = mean(exp(2ρ)) − 1 and chi2_seq = mean
      over sequences of exp(2 Σ_t ρ_t) − 1.
    """
    old = old_log_prob.detach()
    log_ratio = old - rollout_log_prob.detach()
    real = mask > 0
    seqs = real.any(dim=-1)
    metrics: dict[str, torch.Tensor] = {}

    weights = None
    if is_level is not None:
        weights = _is_weights(log_ratio, mask, is_level, is_threshold, is_batch_normalize, metrics)

    keep = torch.ones_like(real)
    if rs_level is not None:
        rejected = _rejected(log_ratio, mask, rs_level, rs_threshold, rs_threshold_lower)
        keep &= ~rejected
        metrics["rollout_rs_masked_fraction"] = _fraction(rejected, real)
        metrics["rollout_rs_seq_masked_fraction"] = _fraction((rejected & real).any(dim=-1), seqs)
    if veto_threshold is not None:
        if veto_threshold <= 0:
            raise ValueError(f"veto_threshold={veto_threshold} must be > 0")
        catastrophic = real & (log_ratio < math.log(veto_threshold))
        vetoed = catastrophic.any(dim=-1)
        keep &= ~vetoed[:, None]
        metrics["rollout_is_veto_fraction"] = _fraction(vetoed, seqs)
        metrics["rollout_is_catastrophic_token_fraction"] = _fraction(catastrophic, real)

    metrics.update(_mismatch_metrics(old, log_ratio, mask, seqs))
    new_mask = mask * keep.to(mask.dtype)
    return weights, new_mask, {f"rollout_corr/{name}": value.detach() for name, value in metrics.items()}


def _level_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Per-token log-ratio of `level`: the token's own, or its sequence's sum ("sequence") or mean
    ("geometric") broadcast over the row."""
    if level == "token":
        return log_ratio
    if level == "sequence":
        return _row_sum(log_ratio, mask)[:, None].expand_as(log_ratio)
    return masked_mean(log_ratio, mask, dim=-1)[:, None].expand_as(log_ratio)


def _is_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    threshold: float,
    batch_normalize: bool,
    metrics: dict[str, torch.Tensor],
) -> torch.Tensor:
    if level not in IS_LEVELS:
        raise ValueError(f"unknown rollout IS level {level!r}; use one of {', '.join(IS_LEVELS)}")
    if threshold <= 0:
        raise ValueError(f"rollout IS threshold {threshold} must be > 0")
    real = mask > 0
    level_log_ratio = _level_log_ratio(log_ratio, mask, level)
    raw = torch.where(real, torch.exp(level_log_ratio.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)), 0.0)
    weights = raw.clamp(max=threshold)
    # at sequence level the ratios counted are the sequences', one per sequence
    units = real if level == "token" else real.any(dim=-1)
    unit_log_ratio = level_log_ratio if level == "token" else level_log_ratio[:, 0]
    metrics["rollout_is_mean"] = masked_mean(weights, mask)
    metrics["rollout_is_raw_mean"] = masked_mean(raw, mask)
    metrics["rollout_is_max"] = raw.max() if raw.numel() else raw.new_zeros(())
    metrics["rollout_is_ratio_fraction_high"] = _fraction(unit_log_ratio > math.log(threshold), units)
    metrics["rollout_is_ratio_fraction_low"] = _fraction(unit_log_ratio < -math.log(threshold), units)
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            mean = masked_mean(weights.amax(dim=-1), real.any(dim=-1))
        metrics["rollout_is_batch_norm_factor"] = torch.where(mean > 1e-8, mean, 1.0)
        weights = weights / metrics["rollout_is_batch_norm_factor"]
    return weights.detach()


def _rejected(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    upper: float | None,
    lower: float | None,
) -> torch.Tensor:
    if level not in RS_LEVELS:
        raise ValueError(f"unknown rollout rejection level {level!r}; use one of {', '.join(RS_LEVELS)}")
    if upper is None:
        raise ValueError(f"rollout rejection at level {level!r} needs rs_threshold (the upper bound)")
    if level in DIVERGENCE_LEVELS:
        if upper <= 0:
            raise ValueError(f"rollout rejection at level {level!r} needs rs_threshold > 0, got {upper}")
        return _divergence(log_ratio, mask, level) > upper
    lower = 1.0 / upper if lower is None else lower
    if not 0 < lower <= upper:
        raise ValueError(f"rollout rejection bounds need 0 < lower={lower} <= upper={upper}")
    if level in K1_LEVELS:
        level, lower, upper = K1_LEVELS[level], 1.0 / upper, 1.0 / lower
    level_log_ratio = _level_log_ratio(log_ratio, mask, level)
    return (level_log_ratio < math.log(lower)) | (level_log_ratio > math.log(upper))


def _divergence(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Per token, the k2 / k3 divergence of `level` (the token's, or its sequence's sum / mean / max)."""
    where, k = level.rsplit("_", 1)
    rho = log_ratio.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)
    token = 0.5 * rho * rho if k == "k2" else torch.exp(rho) - 1 - rho
    if where == "token":
        return token
    if where == "seq_sum":
        per_seq = _row_sum(token, mask)
    elif where == "seq_mean":
        per_seq = masked_mean(token, mask, dim=-1)
    else:
        per_seq = torch.where(mask > 0, token, 0.0).amax(dim=-1)  # divergences are ≥ 0
    return per_seq[:, None].expand_as(log_ratio)


def _mismatch_metrics(
    old: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, seqs: torch.Tensor
) -> dict[str, torch.Tensor]:
    rollout = old - log_ratio
    bounded = log_ratio.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)
    mean_old = masked_mean(old, mask, dim=-1)
    mean_rollout = masked_mean(rollout, mask, dim=-1)
    seq_log_ratio = _row_sum(log_ratio, mask).clamp(-_SAFETY_BOUND, _SAFETY_BOUND)
    return {
        "kl": masked_mean(-log_ratio, mask),
        "k3_kl": masked_mean(torch.exp(bounded) - bounded - 1, mask),
        "training_ppl": masked_mean(torch.exp(-mean_old), seqs),
        "rollout_ppl": masked_mean(torch.exp(-mean_rollout), seqs),
        "log_ppl_diff": masked_mean(mean_rollout - mean_old, seqs),
        "ppl_ratio": masked_mean(torch.exp(mean_rollout - mean_old), seqs),
        "chi2_token": masked_mean(torch.exp(2 * bounded), mask) - 1,
        "chi2_seq": masked_mean(torch.exp(2 * seq_log_ratio), seqs) - 1,
    }


def _row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, values, 0.0).sum(dim=-1)


def _fraction(flags: torch.Tensor, over: torch.Tensor) -> torch.Tensor:
    """Fraction of the positions of `over` (bool) where `flags` holds; 0 when `over` is empty."""
    return masked_mean(flags.to(torch.float64), over)
