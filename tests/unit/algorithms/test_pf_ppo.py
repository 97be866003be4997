"""PF-PPO: the weights formula exactly, and the resampled indices following weight / Σ weight (a
chi-square bound on many seeded draws, so it cannot flake)."""

from __future__ import annotations

import pytest
import torch

from megarl.algorithms.pf_ppo import REWEIGHT_METHODS, WEIGHT_FLOOR, pf_ppo_resample, pf_ppo_weights

pytestmark = pytest.mark.unit

SCORES = torch.tensor([0.5, -2.0, 3.0, 0.0, 3.0, -2.0, 1.0, 0.25], dtype=torch.float32)
GROUP_IDS = torch.tensor([8, 8, 8, 8, 2, 2, 2, 2])


def expected_weights(scores: list[float], method: str, power: float) -> list[float]:
    high, low = max(scores), min(scores)
    if method == "pow":
        raw = [abs(s) ** power for s in scores]
    elif method == "max_min":
        raw = [1.0 if s in (high, low) else 0.0 for s in scores]
    else:
        raw = [0.4 if s == high else 0.1 for s in scores]
    return [w + 1e-8 for w in raw]


@pytest.mark.parametrize("method", REWEIGHT_METHODS)
@pytest.mark.parametrize("power", [0.0, 0.5, 1.0, 2.0, 3.0])
def test_weights_follow_the_formula(method, power):
    weights = pf_ppo_weights(SCORES, method, power)
    assert weights.dtype == torch.float64
    expected = expected_weights(SCORES.tolist(), method, power)
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64), rtol=1e-15, atol=0.0)


@pytest.mark.parametrize("method", ["max_min", "max_random"])
def test_weights_per_group_take_each_prompts_best_and_worst(method):
    weights = pf_ppo_weights(SCORES, method, group_ids=GROUP_IDS)
    expected = []
    for g in GROUP_IDS.unique().tolist():
        rows = (GROUP_IDS == g).nonzero().squeeze(-1).tolist()
        expected += list(zip(rows, expected_weights([SCORES[i].item() for i in rows], method, 2.0)))
    torch.testing.assert_close(weights, torch.tensor([w for _, w in sorted(expected)], dtype=torch.float64))
    if method == "max_min":  # group 8: 3.0 and −2.0; group 2: 3.0 and −2.0 (rows 4, 5)
        assert (weights > 0.5).nonzero().squeeze(-1).tolist() == [1, 2, 4, 5]


def test_zero_weights_fall_back_to_uniform_sampling():
    torch.testing.assert_close(
        pf_ppo_weights(torch.zeros(4), "pow"), torch.full((4,), WEIGHT_FLOOR, dtype=torch.float64)
    )
    draws = pf_ppo_resample(torch.zeros(4), torch.Generator().manual_seed(0))
    assert draws.shape == (4,) and draws.dtype == torch.long


@pytest.mark.parametrize(
    ("method", "power"), [("pow", 2.0), ("pow", 0.5), ("max_min", 2.0), ("max_random", 2.0)]
)
def test_resampling_frequencies_match_the_weights(method, power):
    gen = torch.Generator().manual_seed(1234)
    n, rounds = len(SCORES), 4000
    counts = torch.zeros(n, dtype=torch.float64)
    for _ in range(rounds):
        indices = pf_ppo_resample(SCORES, gen, method, power)
        assert indices.shape == (n,) and indices.dtype == torch.long
        counts += torch.bincount(indices, minlength=n).double()
    weights = pf_ppo_weights(SCORES, method, power)
    expected = weights / weights.sum() * n * rounds
    kept = expected > 1.0  # rows of (floor) weight 1e-8 are never drawn
    assert torch.all(counts[~kept] == 0)
    chi2 = ((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum().item()
    # ≤ 7 degrees of freedom; P(χ² > 40) < 1e-6, and the seed makes the draw fixed anyway
    assert chi2 < 40.0, (counts.tolist(), expected.tolist())


def test_resampling_is_reproducible_from_the_generator():
    first = pf_ppo_resample(SCORES, torch.Generator().manual_seed(7))
    again = pf_ppo_resample(SCORES, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    assert pf_ppo_resample(SCORES[:0], torch.Generator()).shape == (0,)


def test_unknown_method_and_negative_power_are_refused():
    with pytest.raises(
        ValueError, match="unknown PF-PPO reweight_method 'best'; use one of pow, max_min, max_random"
    ):
        pf_ppo_weights(SCORES, "best")
    with pytest.raises(ValueError, match="weight_pow=-1.0 must be ≥ 0"):
        pf_ppo_weights(SCORES, "pow", -1.0)
