"""Advantage estimators against loops written from their definitions, on a batch with ragged lengths,
an empty response, and groups in arbitrary order (a single-sample group and an all-equal group)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from megarl.algorithms.advantages import (
    ESTIMATORS,
    compute_advantages,
    drgrpo,
    gae,
    grpo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    rloo,
    scores_to_token_rewards,
)
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, mask_of, randn

pytestmark = pytest.mark.unit

# rows 0, 2, 5 share id 7; rows 1, 4 share id 3 (equal scores); rows 3 (empty) and 6 are alone
GROUP_IDS = torch.tensor([7, 3, 7, 100, 3, 7, 42], dtype=torch.int64)
SCORES = torch.tensor([1.0, 0.5, -2.0, 3.0, 0.5, 0.25, 4.0], dtype=torch.float64)


def close(got: torch.Tensor, expected: list[list[float]], tol: float = 1e-12) -> None:
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


def per_token(per_seq: list[float], lengths: list[int] = LENGTHS) -> list[list[float]]:
    return [[a if t < n else 0.0 for t in range(RESPONSE_LEN)] for a, n in zip(per_seq, lengths)]


def whiten(rows: list[list[float]], lengths: list[int] = LENGTHS) -> list[list[float]]:
    flat = [x for row, n in zip(rows, lengths) for x in row[:n]]
    mean, std = statistics.mean(flat), math.sqrt(statistics.variance(flat) + 1e-8)
    return [[(x - mean) / std if t < n else 0.0 for t, x in enumerate(row)] for row, n in zip(rows, lengths)]


def groups() -> dict[int, list[float]]:
    members: dict[int, list[float]] = {}
    for g, s in zip(GROUP_IDS.tolist(), SCORES.tolist()):
        members.setdefault(g, []).append(s)
    return members


@pytest.fixture
def token_rewards(gen, mask) -> torch.Tensor:
    return randn(gen, len(LENGTHS), RESPONSE_LEN) * mask


def test_scores_land_on_the_last_real_token(mask):
    rewards = scores_to_token_rewards(SCORES, mask)
    expected = [
        [s if t == n - 1 else 0.0 for t in range(RESPONSE_LEN)] for s, n in zip(SCORES.tolist(), LENGTHS)
    ]
    close(rewards, expected)


def reference_gae(rewards, values, real, gamma, lam):
    """Backwards over each row's real positions only; the value after the last one is 0."""
    advantages, returns = [], []
    for r, v, m in zip(rewards, values, real):
        adv = [0.0] * len(r)
        next_value, running = 0.0, 0.0
        for t in reversed([t for t in range(len(r)) if m[t]]):
            running = r[t] + gamma * next_value - v[t] + gamma * lam * running
            adv[t], next_value = running, v[t]
        advantages.append(adv)
        returns.append([a + v[t] if m[t] else 0.0 for t, a in enumerate(adv)])
    return advantages, returns


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.8), (0.5, 0.0)])
def test_gae_matches_the_recursion(gen, mask, token_rewards, gamma, lam):
    values = torch.where(mask > 0, randn(gen, *mask.shape), float("nan"))  # padding must never be read
    adv, ret = gae(token_rewards, values, mask, gamma, lam, whiten=False)
    ref_adv, ref_ret = reference_gae(token_rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    close(adv, ref_adv)
    close(ret, ref_ret)
    whitened, ret_w = gae(token_rewards, values, mask, gamma, lam)
    close(whitened, whiten(ref_adv))
    close(ret_w, ref_ret)


def test_gae_skips_holes_in_the_mask(gen, token_rewards):
    holes = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 1]], dtype=torch.float64)
    rewards, values = token_rewards[:2] * holes, randn(gen, 2, RESPONSE_LEN)
    adv, ret = gae(rewards, values, holes, 0.9, 0.7, whiten=False)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), holes.tolist(), 0.9, 0.7)
    close(adv, ref_adv)
    close(ret, ref_ret)


def test_grpo_normalises_within_groups_in_any_order(mask):
    members = groups()
    expected = []
    for g, s in zip(GROUP_IDS.tolist(), SCORES.tolist()):
        scores = members[g]
        mean, std = (statistics.mean(scores), statistics.stdev(scores)) if len(scores) > 1 else (0.0, 1.0)
        expected.append((s - mean) / (std + 1e-6))
    adv, ret = grpo(SCORES, GROUP_IDS, mask)
    close(adv, per_token(expected))
    assert ret is adv
    assert torch.all(adv[1] == 0) and torch.all(adv[4] == 0)  # group 3: equal scores → 0, not nan
    assert adv[6, 0].item() == pytest.approx(4.0 / (1 + 1e-6), rel=1e-12)  # alone: mean 0, std 1


def test_drgrpo_only_subtracts_the_group_mean(mask):
    members = groups()
    expected = [
        s - (statistics.mean(members[g]) if len(members[g]) > 1 else 0.0)
        for g, s in zip(GROUP_IDS.tolist(), SCORES.tolist())
    ]
    close(drgrpo(SCORES, GROUP_IDS, mask)[0], per_token(expected))
    close(grpo(SCORES, GROUP_IDS, mask, norm_by_std=False)[0], per_token(expected))


def test_rloo_baseline_leaves_the_sample_out(mask):
    expected = []
    for i, (g, s) in enumerate(zip(GROUP_IDS.tolist(), SCORES.tolist())):
        others = [SCORES[j].item() for j in range(len(SCORES)) if GROUP_IDS[j] == g and j != i]
        expected.append(s - statistics.mean(others) if others else s)
    adv, ret = rloo(SCORES, GROUP_IDS, mask)
    close(adv, per_token(expected))
    close(ret, per_token(expected))


def returns_to_go(rewards: list[list[float]], gamma: float) -> list[list[float]]:
    out = []
    for row, n in zip(rewards, LENGTHS):
        out.append(
            [sum(gamma ** (k - t) * row[k] for k in range(t, n)) if t < n else 0.0 for t in range(len(row))]
        )
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_whitens_discounted_returns(mask, token_rewards, gamma):
    expected_returns = returns_to_go(token_rewards.tolist(), gamma)
    adv, ret = reinforce_plus_plus(token_rewards, mask, gamma)
    close(ret, expected_returns)
    close(adv, whiten(expected_returns))


def test_reinforce_plus_plus_baseline_whitens_group_centred_scores(mask):
    members = groups()
    centred = [
        s - (statistics.mean(members[g]) if len(members[g]) > 1 else 0.0)
        for g, s in zip(GROUP_IDS.tolist(), SCORES.tolist())
    ]
    adv, ret = reinforce_plus_plus_baseline(SCORES, GROUP_IDS, mask)
    close(adv, whiten(per_token(centred)))
    assert ret is adv


def test_remax_subtracts_the_greedy_score(mask, token_rewards):
    greedy = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, 0.25, -0.5], dtype=torch.float64)
    rtg = returns_to_go(token_rewards.tolist(), 1.0)
    expected = [
        [x - b if t < n else 0.0 for t, x in enumerate(row)]
        for row, b, n in zip(rtg, greedy.tolist(), LENGTHS)
    ]
    adv, ret = remax(token_rewards, greedy, mask)
    close(adv, expected)
    close(ret, rtg)


def test_every_estimator_is_zero_on_padding(gen, mask, token_rewards):
    inputs = dict(
        token_rewards=token_rewards,
        values=randn(gen, *mask.shape),
        scores=SCORES,
        group_ids=GROUP_IDS,
        baseline_scores=SCORES.flip(0),
        old_log_probs=torch.where(mask > 0, -randn(gen, *mask.shape).abs(), float("nan")),
        sum_pi_squared=torch.where(
            mask > 0, torch.rand(mask.shape, generator=gen, dtype=torch.float64), float("nan")
        ),
        mask=mask,
        gamma=0.95,
        lam=0.9,
    )
    for name in ESTIMATORS:
        adv, ret = compute_advantages(name, **inputs)
        assert adv.shape == ret.shape == mask.shape, name
        assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0), name
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name


def test_registry_names_and_errors(mask):
    assert set(ESTIMATORS) == {
        "gae",
        "grpo",
        "drgrpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "grpo_passk",
        "opo",
        "gpg",
        "optimal_token_baseline",
    }
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; use one of gae, grpo, drgrpo"):
        compute_advantages("ppo", scores=SCORES, group_ids=GROUP_IDS, mask=mask)
    with pytest.raises(TypeError, match="'gae' needs values, gamma, lam"):
        compute_advantages("gae", token_rewards=SCORES, mask=mask)
    torch.testing.assert_close(
        compute_advantages("drgrpo", scores=SCORES, group_ids=GROUP_IDS, mask=mask, gamma=1.0)[0],
        grpo(SCORES, GROUP_IDS, mask, norm_by_std=False)[0],
    )


def test_single_prompt_batch_with_one_row(mask):
    one = mask_of([3])
    adv, _ = grpo(SCORES[:1], GROUP_IDS[:1], one)
    close(adv, [[1.0 / (1 + 1e-6)] * 3 + [0.0, 0.0]])
    close(rloo(SCORES[:1], GROUP_IDS[:1], one)[0], [[1.0, 1.0, 1.0, 0.0, 0.0]])


def test_reinforce_plus_plus_carries_the_return_across_holes_in_the_mask():
    """Tool-output tokens (mask 0) inside a response do not cut the return: rewards [0, 0, 0, 1], mask
    [1, 0, 1, 1] give returns [1, ·, 1, 1] (0 at the hole). verl 0.9.1 gives the same (computed with the
    reference install); verl up to 0.8 restarted the return at each hole, [0, ·, 1, 1], the bug reported
    as verl issue #7278 and fixed by verl PR #7300."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    _, returns = reinforce_plus_plus(rewards, mask, gamma=1.0)
    assert returns.tolist() == [[1.0, 0.0, 1.0, 1.0]]
