"""Masked reductions of token tensors: the loss aggregation modes and masked mean / variance / whitening.

Token tensors are [batch, response_len] with a `mask` of the same shape (1 = real response token,
0 = padding). Padding values never reach a result, even when they are nan or inf.

Splitting a mini-batch: a worker computes the loss of one mini-batch as a sum over micro-batches (and
data-parallel ranks) of `aggregate(...)` on each part. Pass the counts of the WHOLE mini-batch —
`num_tokens` (masked tokens) and `num_seqs` (sequences with a masked token), summed over every
micro-batch and rank — and the
parts add up to exactly the whole-batch loss, however the batch was split. With the default local
counts each part is normalised by itself, and the sum depends on the split.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

Count = int | float | torch.Tensor


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    horizon: Count | None = None,
) -> torch.Tensor:
    """Reduce token values [batch, len] to one scalar with a loss aggregation mode.

    - "token-mean": Σ v·m / num_tokens
    - "seq-mean-token-sum": Σ_seq Σ_t v·m / num_seqs
    - "seq-mean-token-mean": Σ_seq (Σ_t v·m / n_seq) / num_seqs, a sequence without tokens adds 0
    - "seq-mean-token-sum-norm" (Dr.GRPO): Σ_seq Σ_t v·m / (num_seqs · horizon), horizon a constant
      (the maximum response length; default values.shape[-1])

    num_seqs counts the sequences with at least one masked token, as verl's agg_loss does: a row emptied
    by rollout rejection or veto leaves the mean of the others unchanged (values [[1,1],[0,0]], mask
    [[1,1],[0,0]], seq-mean-token-mean: 1.0, not 0.5). `num_tokens` / `num_seqs` default to this batch's
    own counts; pass the global counts of the mini-batch when it is split over micro-batches or ranks
    (see the module doc). A zero count gives 0, not nan.
    """
    masked = _masked(values, mask)
    if mode == "token-mean":
        count = mask.sum() if num_tokens is None else num_tokens
        return _divide(masked.sum(), count)
    seqs = sequences_with_tokens(mask) if num_seqs is None else num_seqs
    if mode == "seq-mean-token-sum":
        return _divide(masked.sum(), seqs)
    if mode == "seq-mean-token-mean":
        per_seq = _divide(masked.sum(dim=-1), mask.to(values.dtype).sum(dim=-1))
        return _divide(per_seq.sum(), seqs)
    if mode == "seq-mean-token-sum-norm":
        steps = values.shape[-1] if horizon is None else horizon
        return _divide(masked.sum(), _as_tensor(seqs, masked) * steps)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; use one of {', '.join(LOSS_AGG_MODES)}")


def sequences_with_tokens(mask: torch.Tensor) -> torch.Tensor:
    """How many rows of `mask` [batch, len] have at least one masked token: the seq-mean modes' count."""
    return (mask > 0).any(dim=-1).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over the masked positions (all of them, or along `dim`); 0 where nothing is masked."""
    weights = mask.to(values.dtype)
    if dim is None:
        return _divide(_masked(values, mask).sum(), weights.sum())
    return _divide(_masked(values, mask).sum(dim=dim), weights.sum(dim=dim))


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` over all masked positions (Bessel-corrected if `unbiased`, like torch.var).

    With fewer than two masked positions the variance is 0 rather than nan.
    """
    count = mask.to(values.dtype).sum()
    centered = values - masked_mean(values, mask)
    squares = _masked(centered * centered, mask).sum()
    return _divide(squares, count - 1 if unbiased else count) * (count > 1)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(values − mean) / sqrt(var + eps) with the masked mean and unbiased variance; padding becomes 0.

    With `shift_mean=False` the mean is added back, so only the scale changes.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _masked(whitened, mask)


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # where() rather than values·mask: garbage (nan/inf) at padding must not leak into sums
    return torch.where(mask > 0, values * mask.to(values.dtype), 0.0)


def _as_tensor(count: Count, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(count, dtype=like.dtype, device=like.device)


def _divide(total: torch.Tensor, count: Count) -> torch.Tensor:
    count = _as_tensor(count, total)
    return torch.where(count > 0, total / torch.where(count > 0, count, 1), 0.0)
