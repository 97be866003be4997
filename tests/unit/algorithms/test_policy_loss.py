"""The policy losses (PPO clip, GSPO, CISPO, SAPO, REINFORCE/GPG, GMPO): values, metrics and gradients
against per-token / per-sequence loops written from the papers, with and without rollout-IS weights."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from megarl.algorithms.loss_traits import LOSS_PARAMS
from megarl.algorithms.policy_loss import (
    POLICY_LOSSES,
    cispo_loss,
    entropy_bonus,
    gmpo_loss,
    gspo_loss,
    ppo_clip_loss,
    reinforce_loss,
    sapo_loss,
)
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, mask_of, randn, row_factors

pytestmark = pytest.mark.unit

LOW, HIGH, C = 0.2, 0.28, 3.0
TAU_POS, TAU_NEG = 1.0, 1.05
TOL = dict(rel=1e-12, abs=1e-12)
EPS = 1e-7  # just inside / outside a clip bound
# log-ratios inside the clip ranges, either side of every bound (PPO's ratio bounds and GMPO's log-space
# bounds), far outside (e^±3) and past the ±20 exp guard
LOG_RATIOS = [-25.0, -3.0, -0.5, -0.1, 0.0, 0.1, 0.5, 3.0, 25.0] + [
    b + s * EPS for b in (math.log(1 - LOW), math.log(1 + HIGH), -LOW, HIGH) for s in (-1, 1)
]
SHAPE = (len(LENGTHS), RESPONSE_LEN)
AGGREGATIONS = [
    ("token-mean", {}),
    ("seq-mean-token-mean", {"num_seqs": 10}),
    ("seq-mean-token-sum-norm", {"num_seqs": 9, "horizon": 8}),
]


@pytest.fixture
def batch(gen):
    """(log_prob with grad, old_log_prob, advantages) over the shared ragged batch: every log-ratio of
    LOG_RATIOS on some real token, advantages of both signs and a few A = 0."""
    old = randn(gen, *SHAPE) - 2
    pick = torch.randint(len(LOG_RATIOS), SHAPE, generator=gen)
    real = mask_of(LENGTHS) > 0
    every = torch.arange(int(real.sum())) % len(LOG_RATIOS)
    pick[real] = every[torch.randperm(every.numel(), generator=gen)]
    log_prob = (old + torch.tensor(LOG_RATIOS, dtype=torch.float64)[pick]).requires_grad_(True)
    advantages = randn(gen, *SHAPE) * 2
    advantages[0, 1] = advantages[4, 3] = 0.0
    return log_prob, old, advantages


@pytest.fixture
def is_weights(gen, mask):
    """Rollout-IS weights in [0, 3) on real tokens, nan on padding (which must never matter)."""
    weights = torch.rand(SHAPE, generator=gen, dtype=torch.float64) * 3
    return torch.where(mask > 0, weights, float("nan"))


def bounded_exp(d: float) -> float:
    return math.exp(min(max(d, -20.0), 20.0))


def reference_ppo(d: float, a: float, lp: float, c: float | None = C):
    """(loss, d loss / d logp, clipped branch taken, dual-clip cap taken) of one token."""
    r = bounded_exp(d)
    unclipped, clipped = -a * r, -a * min(max(r, 1 - LOW), 1 + HIGH)
    loss, grad = max(unclipped, clipped), (0.0 if clipped > unclipped or abs(d) > 20 else -a * r)
    capped = c is not None and a < 0 and loss > -a * c
    if capped:
        loss, grad = -a * c, 0.0
    return loss, grad, clipped > unclipped, capped


def reference_cispo(d: float, a: float, lp: float):
    """MiniMax-M1: J = sg(clip(r))·A·log π, so the loss is −clip(r)·A·logp and its gradient −clip(r)·A."""
    r = bounded_exp(d)
    weight = min(max(r, 1 - LOW), 1 + HIGH)
    return -weight * a * lp, -weight * a, weight != r, False


def reference_sapo(d: float, a: float, lp: float):
    """SAPO: loss −A·σ(τ(r − 1))·4/τ, gradient −A·4σ(1 − σ)·r (none past the exp guard)."""
    r, tau = bounded_exp(d), (TAU_POS if a > 0 else TAU_NEG)
    gate = 1 / (1 + math.exp(-tau * (r - 1)))
    grad = 0.0 if abs(d) > 20 else -a * 4 * gate * (1 - gate) * r
    return -a * gate * 4 / tau, grad, False, False


def reference_pg(d: float, a: float, lp: float):
    return -a * lp, -a, False, False


TOKEN_LOSSES = {
    "vanilla": (lambda *args, **kw: ppo_clip_loss(*args, clip_ratio_c=C, **kw), reference_ppo),
    "vanilla-no-dual-clip": (ppo_clip_loss, lambda d, a, lp: reference_ppo(d, a, lp, None)),
    "cispo": (cispo_loss, reference_cispo),
    "sapo": (sapo_loss, reference_sapo),
    "reinforce": (reinforce_loss, reference_pg),
}


@pytest.mark.parametrize("agg_mode, counts", AGGREGATIONS)
@pytest.mark.parametrize("with_weights", [False, True])
@pytest.mark.parametrize("name", list(TOKEN_LOSSES))
def test_token_loss_value_metrics_and_gradient(batch, mask, is_weights, name, with_weights, agg_mode, counts):
    loss_fn, reference = TOKEN_LOSSES[name]
    log_prob, old, adv = batch
    weights = is_weights if with_weights else None
    loss, metrics = loss_fn(
        log_prob, old, adv, mask, LOW, HIGH, rollout_is_weights=weights, agg_mode=agg_mode, **counts
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    factors = row_factors(LENGTHS, agg_mode, **counts)
    total, grads, clipped, capped, kl = 0.0, torch.zeros(SHAPE, dtype=torch.float64), 0, 0, 0.0
    for i, length in enumerate(LENGTHS):
        for t in range(length):
            lp, o, a = log_prob[i, t].item(), old[i, t].item(), adv[i, t].item()
            token_loss, token_grad, was_clipped, was_capped = reference(lp - o, a, lp)
            w = weights[i, t].item() if with_weights else 1.0
            total += factors[i] * w * token_loss
            grads[i, t] = factors[i] * w * token_grad
            clipped, capped, kl = clipped + was_clipped, capped + was_capped, kl + o - lp
    n = sum(LENGTHS)
    assert loss.item() == pytest.approx(total, **TOL)
    torch.testing.assert_close(grad, grads, rtol=1e-12, atol=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(clipped / n, **TOL)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(capped / n, **TOL)
    assert metrics["ppo_kl"].item() == pytest.approx(kl / n, **TOL)
    assert (clipped > 0) == (name in ("vanilla", "vanilla-no-dual-clip", "cispo"))
    assert (capped > 0) == (name == "vanilla")


def test_gpg_is_the_reinforce_loss():
    assert POLICY_LOSSES["gpg"] is POLICY_LOSSES["reinforce"] is reinforce_loss


def test_dual_clip_must_exceed_one(batch, mask):
    log_prob, old, adv = batch
    with pytest.raises(ValueError, match="clip_ratio_c=1.0 must be > 1"):
        ppo_clip_loss(log_prob, old, adv, mask, LOW, HIGH, clip_ratio_c=1.0)


def test_sapo_temperatures_must_be_positive(batch, mask):
    with pytest.raises(ValueError, match="tau_pos=0.0, tau_neg=1.05 must both be > 0"):
        sapo_loss(*batch, mask, LOW, HIGH, tau_pos=0.0)


SEQ_LOG_RATIOS = [0.0, 0.5, -0.4, 0.0, 2.0, 0.05, -1.5]  # per sequence: inside, above, below, far off
SEQ_ADVANTAGES = [1.0, 1.5, -0.5, 2.0, -1.0, -2.0, 0.7]


@pytest.fixture
def gspo_batch(gen, mask):
    old = randn(gen, *SHAPE) - 2
    noise = randn(gen, *SHAPE) * 0.3  # token log-ratios vary around each sequence's
    log_prob = (old + torch.tensor(SEQ_LOG_RATIOS, dtype=torch.float64)[:, None] + noise).requires_grad_(True)
    adv = torch.tensor(SEQ_ADVANTAGES, dtype=torch.float64)[:, None] * mask
    return log_prob, old, adv


def reference_gspo(log_prob, old):
    """The paper's sequence-level objective: mean over sequences of the clipped s_i·A_i, where
    s_i = (π/π_old)^(1/|y_i|) is differentiated as a whole (no stop-gradient tricks)."""
    losses, clipped = [], 0
    for i, length in enumerate(LENGTHS):
        if length == 0:
            continue
        s = torch.exp(sum(log_prob[i, t] - old[i, t] for t in range(length)) / length)
        a = SEQ_ADVANTAGES[i]
        unclipped, clipped_loss = -a * s, -a * torch.clamp(s, 1 - LOW, 1 + HIGH)
        clipped += length * bool(clipped_loss > unclipped)
        losses.append(torch.maximum(unclipped, clipped_loss))
    return sum(losses) / len(losses), clipped  # the mean over the sequences with tokens, as verl


@pytest.mark.parametrize("c", [None, C])
def test_gspo_matches_the_sequence_objective_and_never_dual_clips(gspo_batch, mask, c):
    log_prob, old, adv = gspo_batch
    loss, metrics = gspo_loss(
        log_prob, old, adv, mask, LOW, HIGH, clip_ratio_c=c, agg_mode="seq-mean-token-mean"
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    ref_loss, clipped = reference_gspo(log_prob, old)
    (ref_grad,) = torch.autograd.grad(ref_loss, log_prob)
    assert loss.item() == pytest.approx(ref_loss.item(), **TOL)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(clipped / sum(LENGTHS), **TOL)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    real = mask > 0
    assert metrics["ppo_kl"].item() == pytest.approx((old - log_prob)[real].mean().item(), **TOL)
    assert clipped > 0 and (grad[mask == 0] == 0).all() and (grad[1] == 0).all()  # row 1 is clipped


@pytest.mark.parametrize("agg_mode, counts", AGGREGATIONS)
def test_gspo_weights_each_token_of_the_sequence_loss(gspo_batch, mask, is_weights, agg_mode, counts):
    log_prob, old, adv = gspo_batch
    loss, _ = gspo_loss(
        log_prob, old, adv, mask, LOW, HIGH, rollout_is_weights=is_weights, agg_mode=agg_mode, **counts
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    factors = row_factors(LENGTHS, agg_mode, **counts)
    total, grads = 0.0, torch.zeros(SHAPE, dtype=torch.float64)
    for i, length in enumerate(LENGTHS):
        if length == 0:
            continue
        s = math.exp(sum(log_prob[i, t].item() - old[i, t].item() for t in range(length)) / length)
        a = SEQ_ADVANTAGES[i]
        unclipped, clipped = -a * s, -a * min(max(s, 1 - LOW), 1 + HIGH)
        for t in range(length):
            w = is_weights[i, t].item()
            total += factors[i] * w * max(unclipped, clipped)
            # GSPO-token: ∇ of token t's term is the sequence loss's, through its own log-prob
            grads[i, t] = 0.0 if clipped > unclipped else factors[i] * w * -a * s
    assert loss.item() == pytest.approx(total, **TOL)
    torch.testing.assert_close(grad, grads, rtol=1e-12, atol=1e-12)


def test_gspo_bounds_the_log_ratio_above_at_ten(mask):
    log_prob = torch.zeros(SHAPE, dtype=torch.float64, requires_grad=True)
    old = torch.full(SHAPE, -30.0, dtype=torch.float64)
    adv = -torch.ones(SHAPE, dtype=torch.float64)  # A < 0: the unclipped branch, −A·s, is taken
    loss, _ = gspo_loss(log_prob, old, adv, mask, LOW, HIGH)
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(10.0), rel=1e-12) and (log_prob.grad == 0).all()


def reference_gmpo(log_prob, old, adv, weights, num_seqs):
    """GMPO per sequence: −Â·exp(mean_t ℓ_t) × geometric mean of the weights, ℓ_t bounded in log space on
    the advantage's side; the gradient −Â·ratio·W/(n·num_seqs) on the tokens whose ℓ_t is not bounded."""
    total, grads = 0.0, torch.zeros(SHAPE, dtype=torch.float64)
    clipped_pos = clipped_neg = 0
    for i, n in enumerate(LENGTHS):
        if n == 0:
            continue
        ells, active = [], []
        for t in range(n):
            d, a = log_prob[i, t].item() - old[i, t].item(), adv[i, t].item()
            ells.append(min(d, HIGH) if a > 0 else max(d, -LOW) if a < 0 else 0.0)
            active.append((a > 0 and d < HIGH) or (a < 0 and d > -LOW))
            clipped_pos += a > 0 and not -LOW <= d <= HIGH
            clipped_neg += a < 0 and not -LOW <= d <= HIGH
        mean_ell = sum(ells) / n
        ratio = math.exp(min(max(mean_ell, -20.0), 20.0))
        a_hat = sum(adv[i, t].item() for t in range(n)) / n
        w = 1.0 if weights is None else math.exp(sum(math.log(weights[i, t].item()) for t in range(n)) / n)
        total += -a_hat * ratio * w / num_seqs
        for t in range(n):
            if active[t] and abs(mean_ell) < 20:
                grads[i, t] = -a_hat * ratio * w / (n * num_seqs)
    return total, grads, clipped_pos, clipped_neg


@pytest.mark.parametrize("num_seqs", [None, 12])
@pytest.mark.parametrize("with_weights", [False, True])
def test_gmpo_matches_the_geometric_mean_objective(batch, mask, is_weights, with_weights, num_seqs):
    log_prob, old, adv = batch
    weights = is_weights.clamp_min(0.05) if with_weights else None
    counts = {} if num_seqs is None else {"num_seqs": num_seqs}
    loss, metrics = gmpo_loss(
        log_prob, old, adv, mask, LOW, HIGH, rollout_is_weights=weights, agg_mode="token-mean", **counts
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    total, grads, clipped_pos, clipped_neg = reference_gmpo(
        log_prob, old, adv, weights, num_seqs or sum(n > 0 for n in LENGTHS)
    )
    n = sum(LENGTHS)
    assert loss.item() == pytest.approx(total, **TOL)
    torch.testing.assert_close(grad, grads, rtol=1e-12, atol=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(clipped_pos / n, **TOL)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(clipped_neg / n, **TOL)
    assert clipped_pos > 0 and clipped_neg > 0


def test_gmpo_bounds_the_mean_log_ratio_at_twenty():
    mask = mask_of([1])
    log_prob = torch.zeros(1, RESPONSE_LEN, dtype=torch.float64, requires_grad=True)
    old = torch.full((1, RESPONSE_LEN), -25.0, dtype=torch.float64)
    loss, _ = gmpo_loss(log_prob, old, -torch.ones_like(old), mask, LOW, HIGH)
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-12) and (log_prob.grad == 0).all()


def test_registry_names_are_verls_and_every_loss_shares_the_signature():
    assert set(POLICY_LOSSES) == {
        "vanilla", "gspo", "cispo", "sapo", "gpg", "reinforce", "geo_mean", "clip_cov", "kl_cov"
    }  # fmt: skip
    assert set(LOSS_PARAMS) == set(POLICY_LOSSES)
    positional = ["log_prob", "old_log_prob", "advantages", "mask", "clip_low", "clip_high"]
    common = {"clip_ratio_c": None, "rollout_is_weights": None, "agg_mode": "token-mean"}
    for name, loss_fn in POLICY_LOSSES.items():
        params = list(inspect.signature(loss_fn).parameters.values())
        assert [p.name for p in params[:6]] == positional, name
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:6]), name
        assert params[-1].kind is inspect.Parameter.VAR_KEYWORD, name
        keyword = {p.name: p.default for p in params[6:-1]}
        assert all(p.kind is p.KEYWORD_ONLY for p in params[6:-1]), name
        assert {k: keyword.pop(k) for k in common} == common, name
        keyword.pop("generator", None)  # runtime randomness, not a config parameter
        assert keyword == LOSS_PARAMS[name], name


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_every_loss_on_an_empty_mask_is_zero_with_finite_gradient(batch, name):
    log_prob, old, adv = batch
    empty = torch.zeros(SHAPE, dtype=torch.float64)
    loss, metrics = POLICY_LOSSES[name](log_prob, old, adv, empty, LOW, HIGH, clip_ratio_c=C)
    loss.backward()
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in metrics.values())
    assert (log_prob.grad == 0).all()


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_every_loss_scales_with_the_weights_and_never_differentiates_them(batch, mask, name):
    log_prob, old, adv = batch
    ones = torch.ones(SHAPE, dtype=torch.float64, requires_grad=True)

    def loss(**kwargs):
        if name == "clip_cov":  # the same random pick both times
            kwargs["generator"] = torch.Generator().manual_seed(1)
        return POLICY_LOSSES[name](log_prob, old, adv, mask, LOW, HIGH, **kwargs)[0]

    plain, doubled = loss(), loss(rollout_is_weights=2 * ones)
    doubled.backward()
    assert doubled.item() == pytest.approx(2 * plain.item(), **TOL)
    assert ones.grad is None


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_fp32_matches_fp64(gen, batch, mask, is_weights, name):
    _, old, adv = batch
    # no ratio within fp32 rounding of a bound: there the losses that select tokens jump
    coarse = torch.tensor(LOG_RATIOS[:9], dtype=torch.float64)
    log_prob = old + coarse[torch.randint(len(coarse), SHAPE, generator=gen)]
    losses = []
    for dtype in (torch.float64, torch.float32):
        kwargs = (
            {"generator": torch.Generator().manual_seed(2), "clip_cov_ratio": 1.0}
            if name == "clip_cov"
            else {}
        )
        loss, _ = POLICY_LOSSES[name](
            *(t.to(dtype) for t in (log_prob, old, adv, mask)),
            LOW,
            HIGH,
            clip_ratio_c=C,
            rollout_is_weights=is_weights.to(dtype),
            **kwargs,
        )
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_entropy_bonus_is_coef_times_aggregated_entropy(gen, mask):
    entropy = randn(gen, len(LENGTHS), RESPONSE_LEN).abs()
    per_seq = [sum(entropy[i, :n].tolist()) for i, n in enumerate(LENGTHS)]
    bonus = entropy_bonus(entropy, mask, 0.01, "seq-mean-token-sum", num_seqs=14)
    assert bonus.item() == pytest.approx(0.01 * sum(per_seq) / 14, **TOL)
    token_mean = entropy_bonus(entropy, mask, 0.01, "token-mean")
    assert token_mean.item() == pytest.approx(0.01 * sum(per_seq) / sum(LENGTHS), **TOL)
