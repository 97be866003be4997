"""KL estimators, the in-reward penalty and the KL coefficient controllers, against their formulas."""

from __future__ import annotations

import math
import re

import pytest
import torch

from megarl.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_penalty,
)
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, randn

pytestmark = pytest.mark.unit

LOGP = [-0.5, -2.0, -1.0, -30.0, -0.1, -3.0]
REF = [-0.7, -1.0, -1.0, -0.2, -40.0, -50.0]  # the last three differ by ~30, ~40, 47 nats: k3 clamps


def k3(logp: float, ref: float) -> float:
    """verl's k3 / low_var_kl: Schulman's k3 with ref − logp clamped to ±20, then the value to [−10, 10]."""
    d = min(max(ref - logp, -20.0), 20.0)
    return min(max(math.exp(d) - d - 1, -10.0), 10.0)


FORMULAS = {
    "k1": lambda lp, r: lp - r,
    "kl": lambda lp, r: lp - r,
    "abs": lambda lp, r: abs(lp - r),
    "k2": lambda lp, r: 0.5 * (lp - r) ** 2,
    "mse": lambda lp, r: 0.5 * (lp - r) ** 2,
    "k3": k3,
    "low_var_kl": k3,
}


def test_the_vocabulary_is_verls_and_every_base_has_a_straight_through_form():
    assert set(KL_ESTIMATORS) == set(FORMULAS) | {f"{name}+" for name in FORMULAS}


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_estimators_match_formulas_and_plus_forms_take_the_k2_gradient(estimator):
    base = estimator.removesuffix("+")
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    kl = kl_penalty(logp, torch.tensor(REF, dtype=torch.float64), estimator)
    (grad,) = torch.autograd.grad(kl.sum(), logp)
    assert kl.tolist() == pytest.approx(
        [FORMULAS[base](lp, r) for lp, r in zip(LOGP, REF)], rel=1e-12, abs=1e-12
    )
    if estimator.endswith("+"):
        # d/dlogp of k2 = ½ (logp − ref)²
        assert grad.tolist() == pytest.approx([lp - r for lp, r in zip(LOGP, REF)], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "abs", "k3"])
def test_plain_estimators_keep_their_own_gradient(estimator):
    logp = torch.tensor(LOGP[:3], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor(REF[:3], dtype=torch.float64)
    (grad,) = torch.autograd.grad(kl_penalty(logp, ref, estimator).sum(), logp)
    d = (logp - ref).detach()
    expected = {"k1": torch.ones_like(d), "abs": torch.sign(d), "k3": 1 - torch.exp(-d)}[estimator]
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


def test_k3_gradient_stays_finite_far_from_the_reference():
    logp = torch.tensor([-200.0, 0.0, -1.0], requires_grad=True)
    ref = torch.tensor([0.0, -200.0, -1.2])
    kl = kl_penalty(logp, ref, "k3")
    kl.sum().backward()
    assert kl[0].item() == 10.0 and torch.isfinite(logp.grad).all()
    # in range, d/dlogp of exp(ref − logp) − (ref − logp) − 1 = 1 − exp(ref − logp)
    assert logp.grad[2].item() == pytest.approx(1 - math.exp(-0.2), rel=1e-5)


@pytest.mark.parametrize("estimator", ["k4", "k3++", "full"])
def test_unknown_estimator_is_named(estimator):
    with pytest.raises(
        ValueError, match=f"unknown KL estimator '{re.escape(estimator)}'; use one of k1, k2, k3"
    ):
        kl_penalty(torch.zeros(1), torch.zeros(1), estimator)


def test_apply_kl_penalty_only_touches_real_tokens(gen, mask):
    rewards, kl = randn(gen, len(LENGTHS), RESPONSE_LEN), randn(gen, len(LENGTHS), RESPONSE_LEN).abs()
    penalised, mean_kl = apply_kl_penalty(rewards, kl, mask, coef=0.05)
    expected, sequence_means = [], []
    for r_row, k_row, n in zip(rewards.tolist(), kl.tolist(), LENGTHS):
        expected.append([r - 0.05 * k if t < n else r for t, (r, k) in enumerate(zip(r_row, k_row))])
        if n:  # verl's batch KL: mean over sequences of the token mean (the empty row is left out)
            sequence_means.append(sum(k_row[:n]) / n)
    torch.testing.assert_close(penalised, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert mean_kl.item() == pytest.approx(sum(sequence_means) / len(sequence_means), rel=1e-12)


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.01)
    ctrl.update(5.0, n_steps=256)
    assert ctrl.value == 0.01 and ctrl.state_dict() == {"value": 0.01}


def test_adaptive_controller_follows_ziegler_and_resumes():
    kls = [0.3, 0.05, 0.11, 0.0, 0.1, 0.5]
    expected, coef = [], 0.2
    for kl in kls:
        error = min(max(kl / 0.1 - 1, -0.2), 0.2)
        coef *= 1 + error * 64 / 1000
        expected.append(coef)
    ctrl = AdaptiveKLController(0.2, target_kl=0.1, horizon=1000)
    seen = []
    for kl in kls[:3]:
        ctrl.update(torch.tensor(kl, dtype=torch.float64), n_steps=64)
        seen.append(ctrl.value)
    resumed = build_kl_controller("adaptive", 123.0, target_kl=0.1, horizon=1000)
    resumed.load_state_dict(ctrl.state_dict())
    for kl in kls[3:]:
        resumed.update(kl, n_steps=64)
        seen.append(resumed.value)
    assert seen == pytest.approx(expected, rel=1e-14)
    assert expected[0] == pytest.approx(0.2 * (1 + 0.2 * 0.064))  # error clipped at +0.2


def test_build_kl_controller_names():
    assert type(build_kl_controller("fixed", 0.1)) is FixedKLController
    with pytest.raises(ValueError, match="use one of fixed, adaptive"):
        build_kl_controller("pid", 0.1)
    with pytest.raises(ValueError, match="must both be > 0"):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)
