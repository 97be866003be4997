"""Clipped value loss: value, metrics and gradient against a per-token loop."""

from __future__ import annotations

import pytest
import torch

from megarl.algorithms.value_loss import clipped_value_loss
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, randn

pytestmark = pytest.mark.unit

CLIP = 0.5
TOL = dict(rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_clipped_value_loss_matches_loop(gen, mask, mode):
    shape = (len(LENGTHS), RESPONSE_LEN)
    old, returns = randn(gen, *shape), randn(gen, *shape)
    values = (old + randn(gen, *shape)).requires_grad_(True)  # moves of ~1: many beyond the ±0.5 clip
    loss, metrics = clipped_value_loss(values, old, returns, mask, CLIP, agg_mode=mode)
    loss.backward()
    n = sum(LENGTHS)
    scale = n if mode == "token-mean" else sum(k > 0 for k in LENGTHS)  # rows with tokens, as verl
    total, grads, clipped, vsum = 0.0, [], 0, 0.0
    for i, length in enumerate(LENGTHS):
        row = [0.0] * RESPONSE_LEN
        for t in range(length):
            v, o, r = values[i, t].item(), old[i, t].item(), returns[i, t].item()
            moved = min(max(v - o, -CLIP), CLIP)
            error, clipped_error = (v - r) ** 2, (o + moved - r) ** 2
            total += 0.5 * max(error, clipped_error)
            if clipped_error > error:
                clipped += 1
                row[t] = (o + moved - r) * (abs(v - o) < CLIP) / scale
            else:
                row[t] = (v - r) / scale
            vsum += v
        grads.append(row)
    assert loss.item() == pytest.approx(total / scale, **TOL)
    assert metrics["vf_clipfrac"].item() == pytest.approx(clipped / n, **TOL)
    assert metrics["vpred_mean"].item() == pytest.approx(vsum / n, **TOL)
    torch.testing.assert_close(values.grad, torch.tensor(grads, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert 0 < clipped < n


def test_unmoved_values_give_half_squared_error(gen, mask):
    values, returns = randn(gen, len(LENGTHS), RESPONSE_LEN), randn(gen, len(LENGTHS), RESPONSE_LEN)
    loss, metrics = clipped_value_loss(values, values, returns, mask, CLIP)
    expected = sum(
        (values[i, t].item() - returns[i, t].item()) ** 2 for i, n in enumerate(LENGTHS) for t in range(n)
    )
    assert loss.item() == pytest.approx(0.5 * expected / sum(LENGTHS), **TOL)
    assert metrics["vf_clipfrac"].item() == 0.0
