"""Group statistics in float64, and every group estimator giving a group of equal scores exactly 0 —
whatever the value, the group size (2..64) and the dtype, next to unequal groups in one shuffled batch."""

from __future__ import annotations

import statistics

import pytest
import torch

from megarl.algorithms.advantages import ESTIMATORS, compute_advantages, scores_to_token_rewards
from megarl.algorithms.estimator_traits import GROUP_ESTIMATORS
from megarl.algorithms.groups import Groups, group_stats

pytestmark = pytest.mark.unit

EQUAL_VALUES = [5.1, 0.1, 1 / 3, -7.3, 1e4 + 0.1]
SIZES = range(2, 65)
RESPONSE_LEN = 4


def test_group_stats_match_statistics_in_any_order():
    ids = torch.tensor([9, 2, 9, 5, 2, 9, 2, 2])
    scores = torch.tensor([1.0, 0.5, -2.0, 3.0, 0.5, 0.25, 0.5, 0.5], dtype=torch.float32)
    stats = group_stats(scores, ids)
    for i, g in enumerate(ids.tolist()):
        members = [s for s, h in zip(scores.tolist(), ids.tolist()) if h == g]
        assert stats.count[i] == len(members)
        assert stats.mean[i].item() == pytest.approx(statistics.fmean(members), rel=1e-15)
        std = statistics.stdev(members) if len(members) > 1 else 0.0
        assert stats.std[i].item() == pytest.approx(std, rel=1e-15, abs=0.0)
        assert stats.equal[i] == (len(set(members)) == 1)
    assert stats.mean.dtype == stats.std.dtype == torch.float64
    assert stats.mean[3] == 3.0 and stats.std[3] == 0 and stats.equal[3]  # alone


def test_groups_reduce_rows_of_token_tensors():
    groups = Groups.of(torch.tensor([4, 1, 4]))
    values = torch.tensor([[1.0, -torch.inf], [2.0, 5.0], [3.0, 7.0]])
    torch.testing.assert_close(
        groups.sum(values[:, :1]), torch.tensor([[4.0], [2.0], [4.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        groups.max(values), torch.tensor([[3.0, 7.0], [2.0, 5.0], [3.0, 7.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(groups.min(values[:, 0]), torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64))


def test_fp32_mean_of_equal_scores_is_the_score():
    scores = torch.full((16,), 5.1, dtype=torch.float32)
    fp32_sum = torch.zeros(1).index_add_(0, torch.zeros(16, dtype=torch.long), scores)
    assert fp32_sum / 16 != scores[0]  # one ulp off: GRPO used to give this group 0.32
    stats = group_stats(scores, torch.zeros(16, dtype=torch.long))
    assert torch.all(stats.mean == scores.double()) and torch.all(stats.std == 0) and stats.equal.all()


def equal_groups_batch(value: float, dtype: torch.dtype, gen: torch.Generator) -> dict:
    """One group of `value` for every size in SIZES, an all-zero group, and unequal groups, shuffled."""
    scores, ids, kinds = [], [], []
    for n in SIZES:
        scores += [value] * n
        ids += [1000 + n] * n
        kinds += ["equal"] * n
    scores += [0.0, 0.0]
    ids += [7, 7]
    kinds += ["zero"] * 2
    for g, n in enumerate([2, 3, 16, 40]):
        scores += (
            value + torch.randn(n, generator=gen, dtype=torch.float64) * max(3.0, abs(value) / 10)
        ).tolist()
        ids += [g] * n
        kinds += ["unequal"] * n
    order = torch.randperm(len(scores), generator=gen)
    lengths = torch.randint(1, RESPONSE_LEN + 1, (len(scores),), generator=gen)
    mask = (torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None]).to(dtype)
    scores_t = torch.tensor(scores, dtype=torch.float64).to(dtype)[order]
    logits = torch.randn(len(scores), RESPONSE_LEN, 5, generator=gen, dtype=torch.float64)
    probs = logits.softmax(-1)
    return dict(
        scores=scores_t,
        token_rewards=scores_to_token_rewards(scores_t, mask),
        group_ids=torch.tensor(ids)[order],
        mask=mask,
        old_log_probs=probs[..., 0].log().to(dtype),
        sum_pi_squared=(probs**2).sum(-1).to(dtype),
        kinds=[kinds[i] for i in order.tolist()],
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("value", EQUAL_VALUES)
def test_every_group_estimator_gives_an_equal_group_exactly_zero(value, dtype):
    batch = equal_groups_batch(value, dtype, torch.Generator().manual_seed(0))
    kinds = batch.pop("kinds")
    equal = torch.tensor([k == "equal" for k in kinds])
    zero = torch.tensor([k == "zero" for k in kinds])
    assert set(GROUP_ESTIMATORS) <= set(ESTIMATORS)
    for name in GROUP_ESTIMATORS:
        adv, _ = compute_advantages(name, **batch, gamma=1.0)
        assert adv.dtype == dtype, name
        real = batch["mask"] > 0
        reference = adv[zero][real[zero]][0]  # an all-zero group: exactly 0 in any arithmetic
        got = adv[equal][real[equal]]
        assert torch.all(got == reference), (name, got[got != reference][:5])
        if name != "reinforce_plus_plus_baseline":  # whitening subtracts the batch mean (see its docstring)
            assert reference == 0, name
        assert torch.any(adv[~equal & ~zero] != 0), name
