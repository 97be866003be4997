"""Clip-Cov and KL-Cov against per-token loops written from Cui et al. (2025): which tokens the covariance
selects, the resulting loss, its gradient and the rollout-IS weighting."""

from __future__ import annotations

import math

import pytest
import torch

from megarl.algorithms.cov_losses import clip_cov_loss, kl_cov_loss
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, randn, row_factors

pytestmark = pytest.mark.unit

LOW, HIGH = 0.2, 0.28
TOL = dict(rel=1e-12, abs=1e-12)
SHAPE = (len(LENGTHS), RESPONSE_LEN)
LB, UB = 0.3, 1.0  # covariance window of the tests' Clip-Cov, sized to the batch (4 candidates)


@pytest.fixture
def batch(gen, mask):
    """Log-probs spread widely (so covariances spread over and beyond the window), log-ratios inside and
    outside PPO's clip range and past the ±20 exp guard, advantages of both signs."""
    old = randn(gen, *SHAPE) * 1.5 - 2
    log_ratio = randn(gen, *SHAPE) * 0.4
    log_ratio[2, 0], log_ratio[6, 4] = 25.0, -25.0
    log_prob = (old + log_ratio).requires_grad_(True)
    return log_prob, old, randn(gen, *SHAPE) * 2


@pytest.fixture
def is_weights(gen, mask):
    weights = torch.rand(SHAPE, generator=gen, dtype=torch.float64) * 3
    return torch.where(mask > 0, weights, float("nan"))


def real_tokens():
    """(row, position) of the masked tokens in row-major order."""
    return [(i, t) for i, n in enumerate(LENGTHS) for t in range(n)]


def covariances(log_prob, adv):
    tokens = real_tokens()
    mean_a = sum(adv[i, t].item() for i, t in tokens) / len(tokens)
    mean_lp = sum(log_prob[i, t].item() for i, t in tokens) / len(tokens)
    return {(i, t): (adv[i, t].item() - mean_a) * (log_prob[i, t].item() - mean_lp) for i, t in tokens}


def ppo_token(d: float, a: float):
    """(unclipped, clipped) surrogate losses and the unclipped branch's gradient of one token."""
    r = math.exp(min(max(d, -20.0), 20.0))
    return -a * r, -a * min(max(r, 1 - LOW), 1 + HIGH), (0.0 if abs(d) > 20 else -a * r)


@pytest.mark.parametrize("ratio, seed", [(0.1, 0), (0.1, 1), (1.0, 0), (1e-9, 3)])
@pytest.mark.parametrize("with_weights", [False, True])
def test_clip_cov_removes_random_high_covariance_tokens(batch, mask, is_weights, ratio, seed, with_weights):
    log_prob, old, adv = batch
    weights = is_weights if with_weights else None
    loss, metrics = clip_cov_loss(
        log_prob, old, adv, mask, LOW, HIGH, rollout_is_weights=weights, agg_mode="seq-mean-token-mean",
        clip_cov_ratio=ratio, clip_cov_lb=LB, clip_cov_ub=UB, generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, log_prob)
    cov = covariances(log_prob, adv)
    candidates, ppo_clipped, above = [], 0, 0
    for i, t in real_tokens():
        unclipped, clipped, _ = ppo_token(log_prob[i, t].item() - old[i, t].item(), adv[i, t].item())
        ppo_clipped += clipped > unclipped
        above += cov[i, t] >= UB and clipped <= unclipped
        if clipped <= unclipped and LB < cov[i, t] < UB:
            candidates.append((i, t))
    count = max(int(ratio * sum(LENGTHS)), 1)
    order = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed)).tolist()
    removed = {candidates[j] for j in order[:count]}
    factors = row_factors(LENGTHS, "seq-mean-token-mean")
    total, grads = 0.0, torch.zeros(SHAPE, dtype=torch.float64)
    for i, t in real_tokens():
        if (i, t) in removed:
            continue
        unclipped, clipped, unclipped_grad = ppo_token(
            log_prob[i, t].item() - old[i, t].item(), adv[i, t].item()
        )
        w = weights[i, t].item() if with_weights else 1.0
        total += factors[i] * w * max(unclipped, clipped)
        grads[i, t] = 0.0 if clipped > unclipped else factors[i] * w * unclipped_grad
    assert loss.item() == pytest.approx(total, **TOL)
    torch.testing.assert_close(grad, grads, rtol=1e-12, atol=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(len(removed) / sum(LENGTHS), **TOL)
    # the batch has candidates, tokens PPO clipped and unclipped tokens above the window
    assert len(candidates) > count * (ratio < 1) and ppo_clipped > 0 and above > 0
    assert len(removed) == min(count, len(candidates))


def test_clip_cov_draws_differ_by_generator(batch, mask):
    log_prob, old, adv = batch
    losses = {
        clip_cov_loss(
            log_prob, old, adv, mask, LOW, HIGH, clip_cov_ratio=0.1, clip_cov_lb=LB, clip_cov_ub=UB,
            generator=torch.Generator().manual_seed(seed),
        )[0].item()
        for seed in range(8)
    }  # fmt: skip
    assert len(losses) > 1


@pytest.mark.parametrize("ratio, coef", [(0.2, 0.1), (1e-9, 1.0)])
@pytest.mark.parametrize("with_weights", [False, True])
def test_kl_cov_penalises_the_top_covariance_tokens(batch, mask, is_weights, ratio, coef, with_weights):
    log_prob, old, adv = batch
    weights = is_weights if with_weights else None
    loss, metrics = kl_cov_loss(
        log_prob, old, adv, mask, LOW, HIGH, rollout_is_weights=weights, kl_cov_ratio=ratio, ppo_kl_coef=coef
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    cov = covariances(log_prob, adv)
    count = max(int(sum(LENGTHS) * ratio), 1)
    penalised = set(sorted(cov, key=cov.get, reverse=True)[:count])
    n = sum(LENGTHS)
    total, grads = 0.0, torch.zeros(SHAPE, dtype=torch.float64)
    for i, t in real_tokens():
        d, a = log_prob[i, t].item() - old[i, t].item(), adv[i, t].item()
        token_loss, _, token_grad = ppo_token(d, a)
        if (i, t) in penalised:
            token_loss, token_grad = token_loss + coef * abs(d), token_grad + coef * math.copysign(1.0, d)
        w = weights[i, t].item() if with_weights else 1.0
        total += w * token_loss / n
        grads[i, t] = w * token_grad / n
    assert loss.item() == pytest.approx(total, **TOL)
    torch.testing.assert_close(grad, grads, rtol=1e-12, atol=1e-12)
    assert metrics["pg_clipfrac"].item() == 0.0
    assert metrics["ppo_kl"].item() == pytest.approx((old - log_prob)[mask > 0].sum().item() / n, **TOL)


@pytest.mark.parametrize(
    "loss_fn, kwargs, message",
    [
        (clip_cov_loss, {"clip_cov_ratio": 0.0}, "clip_cov_ratio=0.0 must be > 0"),
        (kl_cov_loss, {"kl_cov_ratio": -1.0}, "kl_cov_ratio=-1.0 must be > 0"),
    ],
)
def test_selection_ratios_must_be_positive(batch, mask, loss_fn, kwargs, message):
    with pytest.raises(ValueError, match=message):
        loss_fn(*batch, mask, LOW, HIGH, **kwargs)
