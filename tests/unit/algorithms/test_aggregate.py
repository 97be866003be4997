"""aggregate / masked statistics against plain-Python loops; global counts make any split add up."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from megarl.algorithms.aggregate import (
    LOSS_AGG_MODES,
    aggregate,
    masked_mean,
    masked_var,
    masked_whiten,
    sequences_with_tokens,
)
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, mask_of, randn

pytestmark = pytest.mark.unit

TOL = dict(rel=1e-12, abs=1e-12)


def reference_aggregate(values, lengths, mode, num_tokens=None, num_seqs=None, horizon=None):
    """The modes written from their definitions, over Python lists of the real tokens."""
    rows = [[values[i][t] for t in range(n)] for i, n in enumerate(lengths)]
    num_tokens = sum(lengths) if num_tokens is None else num_tokens
    num_seqs = sum(n > 0 for n in lengths) if num_seqs is None else num_seqs  # rows with tokens (verl)
    horizon = len(values[0]) if horizon is None else horizon
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / num_tokens if num_tokens else 0.0
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / num_seqs
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows if r) / num_seqs
    return sum(sum(r) for r in rows) / (num_seqs * horizon)


@pytest.fixture
def values(gen, mask) -> torch.Tensor:
    v = randn(gen, len(LENGTHS), RESPONSE_LEN)
    return torch.where(mask > 0, v, float("nan"))  # garbage on padding must not leak


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_matches_definition(values, mask, mode):
    expected = reference_aggregate(values.tolist(), LENGTHS, mode)
    assert aggregate(values, mask, mode).item() == pytest.approx(expected, **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_explicit_counts_replace_local_ones(values, mask, mode):
    counts = dict(num_tokens=40, num_seqs=11, horizon=8)
    expected = reference_aggregate(values.tolist(), LENGTHS, mode, **counts)
    assert aggregate(values, mask, mode, **counts).item() == pytest.approx(expected, **TOL)
    as_tensors = {k: torch.tensor(v) for k, v in counts.items()}
    assert aggregate(values, mask, mode, **as_tensors).item() == pytest.approx(expected, **TOL)


SPLITS = [[7], [3, 4], [1, 2, 4], [2, 2, 2, 1], [1] * 7]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("split", SPLITS, ids=str)
def test_parts_with_global_counts_sum_to_the_whole_batch(values, mask, mode, split):
    """What the workers rely on: micro-batch losses with the mini-batch's counts add up to its loss, even
    when each micro-batch is trimmed to its own longest response (so horizon must be passed)."""
    whole = aggregate(values, mask, mode)
    counts = dict(num_tokens=mask.sum(), num_seqs=sequences_with_tokens(mask), horizon=values.shape[1])
    total = torch.zeros((), dtype=values.dtype)
    for v, m in zip(values.split(split), mask.split(split)):
        width = max(1, int(m.sum(dim=-1).max()))
        total = total + aggregate(v[:, :width], m[:, :width], mode, **counts)
    assert total.item() == pytest.approx(whole.item(), **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_padding_gives_zero_not_nan(values, mode):
    empty = torch.zeros_like(values)
    assert aggregate(values, empty, mode).item() == 0.0
    assert aggregate(values, empty, mode, num_tokens=0, num_seqs=0).item() == 0.0


def test_gradient_is_zero_on_padding_and_finite(values, mask):
    v = values.clone().requires_grad_(True)
    aggregate(v, mask, "token-mean").backward()
    expected = mask / mask.sum()
    torch.testing.assert_close(v.grad, expected, rtol=0, atol=1e-15)


def test_unknown_mode_lists_valid_ones(values, mask):
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        aggregate(values, mask, "seq-mean")


def test_masked_mean_all_and_per_row(values, mask):
    real = [[x for x, m in zip(row, mrow) if m] for row, mrow in zip(values.tolist(), mask.tolist())]
    flat = [x for row in real for x in row]
    assert masked_mean(values, mask).item() == pytest.approx(sum(flat) / len(flat), **TOL)
    per_row = [sum(r) / len(r) if r else 0.0 for r in real]
    assert masked_mean(values, mask, dim=-1).tolist() == pytest.approx(per_row, **TOL)


def test_masked_var_matches_statistics(values, mask):
    flat = [x for x, m in zip(values.flatten().tolist(), mask.flatten().tolist()) if m]
    assert masked_var(values, mask).item() == pytest.approx(statistics.variance(flat), **TOL)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(statistics.pvariance(flat), **TOL)


def test_masked_var_of_fewer_than_two_tokens_is_zero(values):
    one = mask_of([0, 0, 1, 0, 0, 0, 0])
    assert masked_var(values, one).item() == 0.0
    assert masked_var(values, torch.zeros_like(values)).item() == 0.0
    assert torch.all(masked_whiten(values, one) == 0)


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_matches_definition(values, mask, shift_mean):
    flat = [x for x, m in zip(values.flatten().tolist(), mask.flatten().tolist()) if m]
    mean, std = statistics.mean(flat), math.sqrt(statistics.variance(flat) + 1e-8)
    expected = [
        [((x - mean) / std + (0 if shift_mean else mean)) if m else 0.0 for x, m in zip(row, mrow)]
        for row, mrow in zip(values.tolist(), mask.tolist())
    ]
    got = masked_whiten(values, mask, shift_mean=shift_mean)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


# verl 0.9.1's core_algos.agg_loss / compute_policy_loss_vanilla (clip 0.2, clip_ratio_c 3) on values or
# advantages [[1, 1], [0, 0]] with mask [[1, 1], [0, 0]] (a row emptied by rollout rejection), computed
# once with the reference install and pinned here (tools/verl_algos_check.py re-checks them)
VERL_EMPTY_ROW = {
    "token-mean": (1.0, -1.0),
    "seq-mean-token-sum": (2.0, -2.0),
    "seq-mean-token-mean": (1.0, -1.0),
    "seq-mean-token-sum-norm": (1.0, None),
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_a_row_without_tokens_is_not_counted_in_the_sequence_mean_as_in_verl(mode):
    from megarl.algorithms.policy_loss import ppo_clip_loss

    ones = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    agg, vanilla = VERL_EMPTY_ROW[mode]
    assert aggregate(ones, ones, mode).item() == agg
    if vanilla is not None:
        zeros = torch.zeros_like(ones)
        assert (
            ppo_clip_loss(zeros, zeros, ones, ones, 0.2, 0.2, clip_ratio_c=3.0, agg_mode=mode)[0].item()
            == vanilla
        )
    # split over two micro-batches (or DP ranks) with the global counts, the parts add up to the same loss
    counts = dict(num_tokens=ones.sum(), num_seqs=sequences_with_tokens(ones), horizon=2)
    parts = sum(aggregate(v, m, mode, **counts) for v, m in zip(ones.split(1), ones.split(1)))
    assert parts.item() == agg
