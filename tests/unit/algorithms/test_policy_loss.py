"""PPO clip (clip-higher, dual clip) and GSPO losses: values, metrics and gradients against per-token /
per-sequence loops written from the definitions."""

from __future__ import annotations

import math

import pytest
import torch

from megarl.algorithms.policy_loss import POLICY_LOSSES, entropy_bonus, gspo_loss, ppo_clip_loss
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, randn

pytestmark = pytest.mark.unit

LOW, HIGH, C = 0.2, 0.28, 3.0
TOL = dict(rel=1e-12, abs=1e-12)
# log-ratios inside the clip range, just outside it, far outside (e^±3) and past the exp guard (±25)
LOG_RATIOS = [-25.0, -3.0, -0.5, -0.1, 0.0, 0.1, 0.2, 0.5, 3.0, 25.0]


@pytest.fixture
def batch(gen):
    """(log_prob with grad, old_log_prob, advantages) over the shared ragged batch."""
    shape = (len(LENGTHS), RESPONSE_LEN)
    old = randn(gen, *shape) - 2
    pick = torch.randint(len(LOG_RATIOS), shape, generator=gen)
    log_prob = (old + torch.tensor(LOG_RATIOS, dtype=torch.float64)[pick]).requires_grad_(True)
    return log_prob, old, randn(gen, *shape) * 2


def reference_ppo_token(d: float, a: float, c: float | None) -> tuple[float, float, bool, bool]:
    """(loss, d loss / d logp, clipped branch taken, dual-clip cap taken) of one token."""
    r = math.exp(min(max(d, -20.0), 20.0))
    unclipped, clipped = -a * r, -a * min(max(r, 1 - LOW), 1 + HIGH)
    loss, grad = max(unclipped, clipped), (0.0 if clipped > unclipped or abs(d) > 20 else -a * r)
    capped = c is not None and a < 0 and loss > -a * c
    if capped:
        loss, grad = -a * c, 0.0
    return loss, grad, clipped > unclipped, capped


@pytest.mark.parametrize("c", [None, C])
def test_ppo_clip_loss_value_metrics_and_gradient(batch, mask, c):
    log_prob, old, adv = batch
    loss, metrics = ppo_clip_loss(log_prob, old, adv, mask, LOW, HIGH, clip_ratio_c=c)
    loss.backward()
    n = sum(LENGTHS)
    total, grads, clipped, capped, kl = 0.0, [], 0, 0, 0.0
    for i, length in enumerate(LENGTHS):
        row = []
        for t in range(RESPONSE_LEN):
            if t >= length:
                row.append(0.0)
                continue
            d = log_prob[i, t].item() - old[i, t].item()
            token_loss, grad, was_clipped, was_capped = reference_ppo_token(d, adv[i, t].item(), c)
            total, clipped, capped, kl = (
                total + token_loss,
                clipped + was_clipped,
                capped + was_capped,
                kl - d,
            )
            row.append(grad / n)
        grads.append(row)
    assert loss.item() == pytest.approx(total / n, **TOL)
    assert metrics["pg_clipfrac"].item() == pytest.approx(clipped / n, **TOL)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(capped / n, **TOL)
    assert metrics["ppo_kl"].item() == pytest.approx(kl / n, **TOL)
    torch.testing.assert_close(
        log_prob.grad, torch.tensor(grads, dtype=torch.float64), rtol=1e-12, atol=1e-12
    )
    assert clipped > 0 and (capped > 0) == (c is not None)  # the batch exercises every branch


def test_ppo_clip_loss_seq_mean_token_mean(batch, mask):
    log_prob, old, adv = batch
    loss, _ = ppo_clip_loss(log_prob, old, adv, mask, LOW, HIGH, C, agg_mode="seq-mean-token-mean")
    per_seq = []
    for i, length in enumerate(LENGTHS):
        tokens = [
            reference_ppo_token(log_prob[i, t].item() - old[i, t].item(), adv[i, t].item(), C)[0]
            for t in range(length)
        ]
        per_seq.append(sum(tokens) / length if length else 0.0)
    assert loss.item() == pytest.approx(sum(per_seq) / len(LENGTHS), **TOL)


def test_dual_clip_must_exceed_one(batch, mask):
    log_prob, old, adv = batch
    with pytest.raises(ValueError, match="clip_ratio_c=1.0 must be > 1"):
        ppo_clip_loss(log_prob, old, adv, mask, LOW, HIGH, clip_ratio_c=1.0)


SEQ_LOG_RATIOS = [0.0, 0.5, -0.4, 0.0, 2.0, 0.05, -1.5]  # per sequence: inside, above, below, far off
SEQ_ADVANTAGES = [1.0, 1.5, -0.5, 2.0, -1.0, -2.0, 0.7]  # row 4: A < 0, s = e^2 > C → dual clip


@pytest.fixture
def gspo_batch(gen, mask):
    shape = (len(LENGTHS), RESPONSE_LEN)
    old = randn(gen, *shape) - 2
    noise = randn(gen, *shape) * 0.3  # token log-ratios vary around each sequence's
    log_prob = (old + torch.tensor(SEQ_LOG_RATIOS, dtype=torch.float64)[:, None] + noise).requires_grad_(True)
    adv = torch.tensor(SEQ_ADVANTAGES, dtype=torch.float64)[:, None] * mask
    return log_prob, old, adv


def reference_gspo(log_prob, old, c):
    """The paper's sequence-level objective: mean over sequences of the clipped s_i·A_i, where
    s_i = (π/π_old)^(1/|y_i|) is differentiated as a whole (no stop-gradient tricks)."""
    losses, clipped, capped = [], 0, 0
    for i, length in enumerate(LENGTHS):
        if length == 0:
            continue
        s = torch.exp(sum(log_prob[i, t] - old[i, t] for t in range(length)) / length)
        a = SEQ_ADVANTAGES[i]
        unclipped, clipped_loss = -a * s, -a * torch.clamp(s, 1 - LOW, 1 + HIGH)
        loss = torch.maximum(unclipped, clipped_loss)
        clipped += length * bool(clipped_loss > unclipped)
        if c is not None and a < 0 and loss > -a * c:
            loss, capped = -a * c * torch.ones_like(loss), capped + length
        losses.append(loss)
    return sum(losses) / len(LENGTHS), clipped, capped


@pytest.mark.parametrize("c", [None, C])
def test_gspo_loss_and_gradient_match_the_sequence_objective(gspo_batch, mask, c):
    log_prob, old, adv = gspo_batch
    loss, metrics = gspo_loss(log_prob, old, adv, mask, LOW, HIGH, c, agg_mode="seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, log_prob)
    ref_loss, clipped, capped = reference_gspo(log_prob, old, c)
    (ref_grad,) = torch.autograd.grad(ref_loss, log_prob)
    assert loss.item() == pytest.approx(ref_loss.item(), **TOL)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    n = sum(LENGTHS)
    assert metrics["pg_clipfrac"].item() == pytest.approx(clipped / n, **TOL)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(capped / n, **TOL)
    real = mask > 0
    assert metrics["ppo_kl"].item() == pytest.approx((old - log_prob)[real].mean().item(), **TOL)
    assert clipped > 0 and (capped > 0) == (c is not None)
    assert (grad[mask == 0] == 0).all() and (grad[1] == 0).all()  # row 1 is clipped: no gradient


def test_gspo_token_mean_weights_tokens(gspo_batch, mask):
    log_prob, old, adv = gspo_batch
    loss, _ = gspo_loss(log_prob, old, adv, mask, LOW, HIGH)
    total = 0.0
    for i, length in enumerate(LENGTHS):
        if length:
            s = math.exp(sum(log_prob[i, t].item() - old[i, t].item() for t in range(length)) / length)
            a = SEQ_ADVANTAGES[i]
            total += length * max(-a * s, -a * min(max(s, 1 - LOW), 1 + HIGH))
    assert loss.item() == pytest.approx(total / sum(LENGTHS), **TOL)


def test_registry():
    assert POLICY_LOSSES == {"vanilla": ppo_clip_loss, "gspo": gspo_loss}


def test_entropy_bonus_is_coef_times_aggregated_entropy(gen, mask):
    entropy = randn(gen, len(LENGTHS), RESPONSE_LEN).abs()
    per_seq = [sum(entropy[i, :n].tolist()) for i, n in enumerate(LENGTHS)]
    bonus = entropy_bonus(entropy, mask, 0.01, "seq-mean-token-sum", num_seqs=14)
    assert bonus.item() == pytest.approx(0.01 * sum(per_seq) / 14, **TOL)
    token_mean = entropy_bonus(entropy, mask, 0.01, "token-mean")
    assert token_mean.item() == pytest.approx(0.01 * sum(per_seq) / sum(LENGTHS), **TOL)
