"""The Bradley–Terry loss against plain Python written from its formula: values, margin, metrics and the
gradient with respect to both scores."""

from __future__ import annotations

import math

import pytest
import torch

from megarl.algorithms.reward_model import bradley_terry_loss

pytestmark = pytest.mark.unit

CHOSEN = [1.5, -0.2, 0.3, 2.0, 0.0]
REJECTED = [0.5, 0.4, 0.3, -1.0, 30.0]  # a win, a loss, a tie, a wide win, a hopeless loss


def _reference(c: float, r: float, m: float = 0.0) -> float:
    return math.log1p(math.exp(-(c - r - m))) if c - r - m > -30 else -(c - r - m)


@pytest.mark.parametrize("margin", [0.0, 0.75])
def test_bradley_terry_matches_the_formula(margin):
    chosen = torch.tensor(CHOSEN, dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor(REJECTED, dtype=torch.float64, requires_grad=True)
    losses, metrics = bradley_terry_loss(chosen, rejected, margin)
    expected = [_reference(c, r, margin) for c, r in zip(CHOSEN, REJECTED)]
    assert losses.tolist() == pytest.approx(expected, rel=1e-12)
    assert metrics["accuracy"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]  # a tie is not a win
    assert metrics["margin"].tolist() == pytest.approx([c - r for c, r in zip(CHOSEN, REJECTED)])
    assert metrics["chosen"].tolist() == CHOSEN and metrics["rejected"].tolist() == REJECTED
    assert not any(v.requires_grad for v in metrics.values())
    losses.mean().backward()
    # d/dc −log σ(c − r − m) = −(1 − σ(c − r − m)), the opposite for r
    sig = [1 / (1 + math.exp(-(c - r - margin))) for c, r in zip(CHOSEN, REJECTED)]
    assert chosen.grad.tolist() == pytest.approx([-(1 - s) / len(sig) for s in sig], rel=1e-9)
    assert rejected.grad.tolist() == pytest.approx([(1 - s) / len(sig) for s in sig], rel=1e-9)


def test_bradley_terry_per_pair_margin_and_shape_check():
    chosen, rejected = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0])
    losses, _ = bradley_terry_loss(chosen, rejected, torch.tensor([0.0, 2.0]))
    assert losses.tolist() == pytest.approx([_reference(1, 0), _reference(1, 0, 2.0)], rel=1e-6)
    with pytest.raises(ValueError, match="differ in shape"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(2))
