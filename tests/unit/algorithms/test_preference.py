"""The offline preference losses (DPO, IPO, ORPO, SimPO, KTO): values, rewards and gradients against plain
Python written from each paper's formula, on hand-made token log-probs of different lengths whose
padding holds garbage (nan, ±inf, 1e30) that the mask must remove."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from megarl.algorithms.preference import (
    dpo_loss,
    ipo_loss,
    kto_loss,
    kto_ref_point,
    orpo_loss,
    sequence_logps,
    simpo_loss,
)
from tests.unit.algorithms.conftest import RESPONSE_LEN, mask_of

pytestmark = pytest.mark.unit

GARBAGE = [math.nan, math.inf, -math.inf, 1e30, 3.0]
# four pairs: policy chosen / rejected and reference chosen / rejected token log-probs; h changes sign
ROWS = {
    "pc": [[-0.5, -1.2, -0.3], [-2.0], [-0.1, -0.4, -0.9, -0.2], [-1.1, -0.7]],
    "pr": [[-0.8, -1.5], [-0.6, -0.9, -1.3, -0.4], [-2.2], [-0.3, -0.5, -1.0]],
    "rc": [[-0.6, -1.0, -0.5], [-1.7], [-0.3, -0.4, -1.0, -0.1], [-1.3, -0.9]],
    "rr": [[-0.7, -1.3], [-0.9, -0.8, -1.0, -0.6], [-1.9], [-0.4, -0.4, -1.2]],
}
SIDES = ("pc", "pr", "rc", "rr")
SIDE_PAIRS = (("pc", "rc"), ("pr", "rr"))  # (policy, reference) of the chosen and the rejected side
# KTO: five unpaired examples (policy, reference) and three mismatched (prompt, completion) pairs
KTO_ROWS = {
    "policy": [[-0.5, -1.0], [-0.2, -0.3, -0.6], [-1.5], [-0.4, -0.8, -0.2, -0.9], [-0.7, -0.1, -0.3]],
    "ref": [[-0.7, -1.1], [-0.4, -0.1, -0.5], [-1.2], [-0.6, -0.6, -0.3, -0.7], [-0.5, -0.4, -0.3]],
}
DESIRABLE = [True, False, True, False, True]
KL_ROWS = {
    "policy": [[-2.0, -1.5, -0.5], [-3.0], [-1.0, -2.5]],
    "ref": [[-2.1, -1.3, -0.7], [-3.2], [-1.2, -2.4]],
}


def padded(rows: list[list[float]], grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, RESPONSE_LEN] float64 log-probs with garbage after each row's tokens, bool mask)."""
    values = [
        [row[t] if t < len(row) else GARBAGE[(i + t) % len(GARBAGE)] for t in range(RESPONSE_LEN)]
        for i, row in enumerate(rows)
    ]
    mask = torch.tensor([[t < len(row) for t in range(RESPONSE_LEN)] for row in rows])
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad), mask


def on_tokens(rows: list[list[float]], per_row: list[float]) -> torch.Tensor:
    """per_row[i] on row i's real tokens, 0 on its padding: the expected gradient of a sequence term."""
    return torch.tensor(
        [[per_row[i] if t < len(row) else 0.0 for t in range(RESPONSE_LEN)] for i, row in enumerate(rows)],
        dtype=torch.float64,
    )


def sums(rows):
    return [sum(row) for row in rows]


def means(rows):
    return [sum(row) / len(row) for row in rows]


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def log_sigmoid(x: float) -> float:
    return -(max(-x, 0.0) + math.log1p(math.exp(-abs(x))))


def close(actual: torch.Tensor, expected, tol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


@pytest.fixture
def tokens() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The padded pair tensors; the policy's (pc, pr) with grad."""
    return {key: padded(ROWS[key], grad=key.startswith("p")) for key in SIDES}


@pytest.mark.parametrize("float_mask", [False, True])
def test_sequence_logps_sum_and_mean_only_the_real_tokens(float_mask):
    rows = [*ROWS["pc"], []]  # the last row has no token
    values, mask = padded(rows, grad=True)
    if float_mask:
        mask = mask_of([len(row) for row in rows])
    total, mean = sequence_logps(values, mask), sequence_logps(values, mask, average=True)
    close(total, [*sums(ROWS["pc"]), 0.0])
    close(mean, [*means(ROWS["pc"]), 0.0])
    (grad_total,) = torch.autograd.grad(total.sum(), values)
    (grad_mean,) = torch.autograd.grad(mean.sum(), values)
    close(grad_total, on_tokens(rows, [1.0] * len(rows)))
    close(grad_mean, on_tokens(rows, [1 / max(len(row), 1) for row in rows]))


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_dpo_matches_the_paper_on_masked_tokens(tokens, beta, eps):
    out = dpo_loss(*(sequence_logps(*tokens[key]) for key in SIDES), beta, label_smoothing=eps)
    grad_c, grad_r = torch.autograd.grad(out.losses.sum(), (tokens["pc"][0], tokens["pr"][0]))
    losses, dloss_dh, chosen, rejected = [], [], [], []
    for c, r, c0, r0 in zip(*(sums(ROWS[key]) for key in SIDES)):
        h = (c - c0) - (r - r0)
        losses.append(-(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h))
        dloss_dh.append(-(1 - eps) * beta * sigmoid(-beta * h) + eps * beta * sigmoid(beta * h))
        chosen.append(beta * (c - c0))
        rejected.append(beta * (r - r0))
    close(out.losses, losses)
    close(out.chosen_rewards, chosen)
    close(out.rejected_rewards, rejected)
    assert not out.chosen_rewards.requires_grad and not out.rejected_rewards.requires_grad
    close(grad_c, on_tokens(ROWS["pc"], dloss_dh))
    close(grad_r, on_tokens(ROWS["pr"], [-g for g in dloss_dh]))


def test_dpo_gradient_in_h_is_minus_beta_sigmoid_and_finite_far_out():
    beta = 0.5
    hs = [-2000.0, -60.0, -1.0, 0.0, 1.0, 60.0, 2000.0]
    h = torch.tensor(hs, dtype=torch.float64, requires_grad=True)
    zeros = torch.zeros_like(h)
    out = dpo_loss(h, zeros, zeros, zeros, beta)
    (grad,) = torch.autograd.grad(out.losses.sum(), h)
    close(out.losses, [-log_sigmoid(beta * x) for x in hs])
    close(grad, [-beta * sigmoid(-beta * x) for x in hs])
    assert torch.autograd.gradcheck(
        lambda c, r: dpo_loss(c, r, zeros[:4], zeros[:4], 0.3, label_smoothing=0.2).losses,
        (
            h[1:5].detach().clone().requires_grad_(),
            torch.tensor([0.3, -1.2, 0.0, 2.5], dtype=torch.float64, requires_grad=True),
        ),
    )


@pytest.mark.parametrize(
    "loss_fn",
    [
        lambda c, r, eps: dpo_loss(c[0], r[0], c[1], r[1], 0.7, eps).losses,
        # γ = 0: with a margin, swapping the responses is not the flipped label (it would flip γ too)
        lambda c, r, eps: simpo_loss(c[0], r[0], 2.5, 0.0, eps).losses,
    ],
    ids=["dpo", "simpo"],
)
def test_label_smoothing_mixes_in_the_loss_of_the_flipped_label(loss_fn):
    chosen, rejected = (
        tuple(torch.tensor(sums(ROWS[key]), dtype=torch.float64) for key in side) for side in SIDE_PAIRS
    )
    flipped = loss_fn(rejected, chosen, 0.0)
    for eps in (0.0, 0.25, 0.49):
        mixed = (1 - eps) * loss_fn(chosen, rejected, 0.0) + eps * flipped
        torch.testing.assert_close(loss_fn(chosen, rejected, eps), mixed, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_ipo_matches_the_paper_on_sequence_sums(tokens, beta):
    out = ipo_loss(*(sequence_logps(*tokens[key]) for key in SIDES), beta)
    grad_c, grad_r = torch.autograd.grad(out.losses.sum(), (tokens["pc"][0], tokens["pr"][0]))
    hs = [(c - c0) - (r - r0) for c, r, c0, r0 in zip(*(sums(ROWS[key]) for key in SIDES))]
    close(out.losses, [(h - 1 / (2 * beta)) ** 2 for h in hs])
    dloss_dh = [2 * (h - 1 / (2 * beta)) for h in hs]
    close(grad_c, on_tokens(ROWS["pc"], dloss_dh))
    close(grad_r, on_tokens(ROWS["pr"], [-g for g in dloss_dh]))
    close(out.chosen_rewards, [beta * (c - c0) for c, c0 in zip(sums(ROWS["pc"]), sums(ROWS["rc"]))])
    close(out.rejected_rewards, [beta * (r - r0) for r, r0 in zip(sums(ROWS["pr"]), sums(ROWS["rr"]))])


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_orpo_matches_the_paper_on_mean_logps(tokens, beta):
    out, log_odds_ratio = orpo_loss(
        sequence_logps(*tokens["pc"], average=True), sequence_logps(*tokens["pr"], average=True), beta
    )
    grad_c, grad_r = torch.autograd.grad(out.losses.sum(), (tokens["pc"][0], tokens["pr"][0]))
    losses, ratios, grads_c, grads_r = [], [], [], []
    for row_c, row_r in zip(ROWS["pc"], ROWS["pr"]):
        m_c, m_r = sum(row_c) / len(row_c), sum(row_r) / len(row_r)
        ratio = (m_c - math.log(1 - math.exp(m_c))) - (m_r - math.log(1 - math.exp(m_r)))
        losses.append(-beta * log_sigmoid(ratio))
        ratios.append(ratio)
        # d log odds / d ḡ = 1 / (1 − p); d ḡ / d token = 1 / length
        dloss = -beta * sigmoid(-ratio)
        grads_c.append(dloss / (1 - math.exp(m_c)) / len(row_c))
        grads_r.append(-dloss / (1 - math.exp(m_r)) / len(row_r))
    close(out.losses, losses)
    close(log_odds_ratio, ratios)
    assert not log_odds_ratio.requires_grad and not out.chosen_rewards.requires_grad
    close(out.chosen_rewards, [beta * m for m in means(ROWS["pc"])])
    close(out.rejected_rewards, [beta * m for m in means(ROWS["pr"])])
    close(grad_c, on_tokens(ROWS["pc"], grads_c))
    close(grad_r, on_tokens(ROWS["pr"], grads_r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_orpo_log_odds_stay_accurate_near_probability_one_and_zero(dtype):
    # in float32 1 − exp(−1e-8) is exactly 0: a naive log(1 − p) would be −inf
    chosen = [-1e-8, -1e-3, -30.0, -80.0]
    out, ratio = orpo_loss(torch.tensor(chosen, dtype=dtype), torch.full((4,), -1.0, dtype=dtype), 1.0)
    rejected_odds = -1.0 - math.log(1 - math.exp(-1.0))
    expected = [m - math.log1p(-math.exp(m)) - rejected_odds for m in chosen]
    torch.testing.assert_close(ratio.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)
    assert out.losses.dtype == dtype and torch.isfinite(out.losses).all()


def test_orpo_at_probability_one_is_finite_with_finite_gradient():
    chosen = torch.tensor([0.0, -0.5], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-0.5, 0.0], dtype=torch.float64, requires_grad=True)
    out, ratio = orpo_loss(chosen, rejected, 0.5)
    out.losses.sum().backward()
    assert torch.isfinite(out.losses).all() and torch.isfinite(ratio).all()
    assert torch.isfinite(chosen.grad).all() and torch.isfinite(rejected.grad).all()


@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("beta, gamma", [(2.0, 0.5), (10.0, 3.0), (0.5, 0.0)])
def test_simpo_matches_the_paper_on_mean_logps(tokens, beta, gamma, eps):
    out = simpo_loss(
        sequence_logps(*tokens["pc"], average=True),
        sequence_logps(*tokens["pr"], average=True),
        beta,
        gamma,
        label_smoothing=eps,
    )
    grad_c, grad_r = torch.autograd.grad(out.losses.sum(), (tokens["pc"][0], tokens["pr"][0]))
    losses, grads_c, grads_r = [], [], []
    for row_c, row_r in zip(ROWS["pc"], ROWS["pr"]):
        z = beta * sum(row_c) / len(row_c) - beta * sum(row_r) / len(row_r) - gamma
        losses.append(-(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z))
        dloss_dz = -(1 - eps) * sigmoid(-z) + eps * sigmoid(z)
        grads_c.append(dloss_dz * beta / len(row_c))
        grads_r.append(-dloss_dz * beta / len(row_r))
    close(out.losses, losses)
    close(out.chosen_rewards, [beta * m for m in means(ROWS["pc"])])
    close(out.rejected_rewards, [beta * m for m in means(ROWS["pr"])])
    close(grad_c, on_tokens(ROWS["pc"], grads_c))
    close(grad_r, on_tokens(ROWS["pr"], grads_r))


@pytest.mark.parametrize("flip", [False, True])
def test_kto_ref_point_is_the_clamped_detached_mean_kl_of_mismatched_pairs(flip):
    policy, ref = ("ref", "policy") if flip else ("policy", "ref")
    kl_policy, mask = padded(KL_ROWS[policy], grad=True)
    z0 = kto_ref_point(sequence_logps(kl_policy, mask), sequence_logps(*padded(KL_ROWS[ref])))
    diffs = [p - r for p, r in zip(sums(KL_ROWS[policy]), sums(KL_ROWS[ref]))]
    assert z0.dim() == 0 and not z0.requires_grad
    assert z0.item() == pytest.approx(max(0.0, sum(diffs) / len(diffs)), rel=1e-12, abs=1e-12)
    assert (z0.item() == 0.0) == flip  # the flipped batch's mean KL is negative
    empty = torch.zeros(0, dtype=torch.float64)
    assert kto_ref_point(empty, empty).item() == 0.0


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.33, 0.7)])
@pytest.mark.parametrize("beta", [0.1, 2.0])
@pytest.mark.parametrize("ref_point", ["kl", 0.0, 0.25])
def test_kto_matches_the_paper(ref_point, beta, weights):
    logps, mask = padded(KTO_ROWS["policy"], grad=True)
    if ref_point == "kl":
        kl_policy, kl_mask = padded(KL_ROWS["policy"], grad=True)
        ref_point = kto_ref_point(sequence_logps(kl_policy, kl_mask), sequence_logps(*padded(KL_ROWS["ref"])))
        z0 = max(0.0, sum(p - r for p, r in zip(sums(KL_ROWS["policy"]), sums(KL_ROWS["ref"])))) / 3
    else:
        z0 = ref_point
    w_d, w_u = weights
    out = kto_loss(
        sequence_logps(logps, mask),
        sequence_logps(*padded(KTO_ROWS["ref"])),
        torch.tensor(DESIRABLE),
        ref_point,
        beta,
        desirable_weight=w_d,
        undesirable_weight=w_u,
    )
    (grad,) = torch.autograd.grad(out.losses.sum(), logps)
    losses, dloss_dr = [], []
    for r, desirable in zip(
        [p - q for p, q in zip(sums(KTO_ROWS["policy"]), sums(KTO_ROWS["ref"]))], DESIRABLE
    ):
        if desirable:
            s = sigmoid(beta * (r - z0))
            losses.append(w_d * (1 - s))
            dloss_dr.append(-w_d * beta * s * (1 - s))
        else:
            s = sigmoid(beta * (z0 - r))
            losses.append(w_u * (1 - s))
            dloss_dr.append(w_u * beta * s * (1 - s))
    close(out.losses, losses)
    close(grad, on_tokens(KTO_ROWS["policy"], dloss_dr))
    close(out.rewards, [beta * (p - q) for p, q in zip(sums(KTO_ROWS["policy"]), sums(KTO_ROWS["ref"]))])
    assert not out.rewards.requires_grad


def test_kto_never_differentiates_the_ref_point():
    logps = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    ref_point = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    out = kto_loss(
        logps, torch.full((2,), -1.5, dtype=torch.float64), torch.tensor([True, False]), ref_point, 1.0
    )
    out.losses.sum().backward()
    assert ref_point.grad is None and logps.grad is not None


def seq_inputs(dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    inputs = {key: sums(ROWS[key]) for key in SIDES} | {"mc": means(ROWS["pc"]), "mr": means(ROWS["pr"])}
    return {key: torch.tensor(value, dtype=dtype, requires_grad=True) for key, value in inputs.items()}


LOSSES = {
    "dpo": lambda t: dpo_loss(t["pc"], t["pr"], t["rc"], t["rr"], 0.5, 0.1),
    "ipo": lambda t: ipo_loss(t["pc"], t["pr"], t["rc"], t["rr"], 0.5),
    "orpo": lambda t: orpo_loss(t["mc"], t["mr"], 0.5)[0],
    "simpo": lambda t: simpo_loss(t["mc"], t["mr"], 2.0, 0.5, 0.1),
    "kto": lambda t: kto_loss(
        t["pc"], t["rc"], torch.tensor([True, False, True, False]), 0.05, 0.5, 1.3, 0.7
    ),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_fp32_matches_fp64_and_keeps_its_dtype(name):
    wide, narrow = (LOSSES[name](seq_inputs(dtype)) for dtype in (torch.float64, torch.float32))
    for field in dataclasses.fields(wide):
        low, high = getattr(narrow, field.name), getattr(wide, field.name)
        assert low.dtype == torch.float32, field.name
        torch.testing.assert_close(low.double(), high, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(LOSSES))
def test_inputs_are_untouched_and_only_the_losses_carry_gradient(name):
    inputs = seq_inputs()
    before = {key: value.detach().clone() for key, value in inputs.items()}
    out = LOSSES[name](inputs)
    assert out.losses.requires_grad
    assert all(not getattr(out, f.name).requires_grad for f in dataclasses.fields(out) if f.name != "losses")
    assert all(torch.equal(inputs[key], before[key]) for key in inputs)


ZEROS = torch.zeros(2, dtype=torch.float64)
LABELS = torch.tensor([True, False])
WITH_BETA = {
    "dpo": lambda beta: dpo_loss(ZEROS, ZEROS, ZEROS, ZEROS, beta),
    "ipo": lambda beta: ipo_loss(ZEROS, ZEROS, ZEROS, ZEROS, beta),
    "orpo": lambda beta: orpo_loss(ZEROS - 1, ZEROS - 1, beta),
    "simpo": lambda beta: simpo_loss(ZEROS, ZEROS, beta, 0.5),
    "kto": lambda beta: kto_loss(ZEROS, ZEROS, LABELS, 0.0, beta),
}
WITH_LABEL_SMOOTHING = {
    "dpo": lambda eps: dpo_loss(ZEROS, ZEROS, ZEROS, ZEROS, 0.1, label_smoothing=eps),
    "simpo": lambda eps: simpo_loss(ZEROS, ZEROS, 2.0, 0.5, label_smoothing=eps),
}


@pytest.mark.parametrize("beta", [0.0, -0.1, math.nan, math.inf])
@pytest.mark.parametrize("name", list(WITH_BETA))
def test_beta_must_be_a_finite_positive_number(name, beta):
    with pytest.raises(ValueError, match=re.escape(f"preference.beta={beta} must be a finite number > 0")):
        WITH_BETA[name](beta)


@pytest.mark.parametrize("eps", [0.5, 0.7, -0.1])
@pytest.mark.parametrize("name", list(WITH_LABEL_SMOOTHING))
def test_label_smoothing_must_be_in_zero_to_one_half(name, eps):
    with pytest.raises(ValueError, match=re.escape(f"preference.label_smoothing={eps} must be in [0, 0.5)")):
        WITH_LABEL_SMOOTHING[name](eps)


@pytest.mark.parametrize("key", ["desirable_weight", "undesirable_weight"])
def test_kto_weights_must_be_non_negative(key):
    with pytest.raises(ValueError, match=re.escape(f"preference.{key}=-1.0 must be a finite number >= 0")):
        kto_loss(ZEROS, ZEROS, LABELS, 0.0, 0.1, **{key: -1.0})
