"""The actor's preference loss of a micro-batch: a weight scales the loss that is backpropagated and so
its gradient, exactly, and leaves the preference loss it reports and the loss's terms as they were."""

from __future__ import annotations

import pytest
import torch

from megarl.algorithms.preference_terms import BatchCounts, PreferenceSettings
from megarl.workers.preference_loss import micro_batch_loss

pytestmark = pytest.mark.unit

PAIRS, WIDTH = 3, 4


def _micro_batch() -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(2 * PAIRS, WIDTH, dtype=torch.float64)
    mask[1, 3] = mask[4, 2:] = 0  # shorter responses
    mb = {
        "mask": mask,
        "rows": torch.arange(2 * PAIRS),
        "ref_logps": -torch.rand(2 * PAIRS, generator=g, dtype=torch.float64) * 4,
        "desirable": torch.tensor([True, False, True, True, False, False]),
    }
    return mb, -torch.rand(2 * PAIRS, WIDTH, generator=g, dtype=torch.float64) * 2


def _loss_and_grad(name: str, weight: float):
    mb, token_logps = _micro_batch()
    token_logps.requires_grad_(True)
    settings = PreferenceSettings(name, beta=0.3)
    if name == "kto":
        counts = BatchCounts(2 * PAIRS, desirable=3, undesirable=3, ref_point=0.1)
    else:
        counts = BatchCounts(PAIRS, chosen_tokens=int(mb["mask"][0::2].sum()))
    loss, metrics = micro_batch_loss(settings, counts, mb, token_logps * mb["mask"], weight)
    loss.backward()
    return loss.detach(), token_logps.grad, metrics


@pytest.mark.parametrize("name", ["dpo", "ipo", "orpo", "simpo", "kto"])
def test_the_weight_scales_the_backpropagated_loss_and_its_gradient_only(name):
    loss, grad, metrics = _loss_and_grad(name, 1.0)
    half_loss, half_grad, half_metrics = _loss_and_grad(name, 0.5)
    assert grad.abs().sum() > 0
    assert half_loss.item() == pytest.approx(0.5 * loss.item(), rel=1e-15)
    assert torch.allclose(half_grad, 0.5 * grad, rtol=1e-15, atol=0)
    assert metrics["unweighted_loss"].item() == loss.item()  # at weight 1 the two are the same
    assert half_metrics["unweighted_loss"].item() == pytest.approx(loss.item(), rel=1e-15)
    assert half_metrics.keys() == metrics.keys()
    for key in metrics:
        assert half_metrics[key].item() == pytest.approx(metrics[key].item(), rel=1e-15), key
