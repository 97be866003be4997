"""GRPO pass@k, OPO, GPG and the optimal token baseline against per-group, per-sequence Python loops
written from their papers' formulas, on random shuffled batches that hit every branch: empty and
one-token responses, groups of 1 and 2, ties for the best, all-equal groups, lone zero scores."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from megarl.algorithms.advantages import compute_advantages, scores_to_token_rewards
from megarl.algorithms.group_advantages import gpg, grpo_passk, opo, optimal_token_baseline

pytestmark = pytest.mark.unit

RESPONSE_LEN = 6
VOCAB = 5
SEEDS = range(12)


def random_case(seed: int, holes: bool = False) -> dict:
    """A batch (float64) of groups of every kind, rows shuffled, group ids arbitrary integers."""
    gen = torch.Generator().manual_seed(seed)

    def randint(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=gen))

    discrete = [0.0, 0.5, 1.0, 2.0]
    groups = [
        [0.0],  # alone with score 0: no gradient for GPG
        [float(torch.randn(1, generator=gen))],  # alone
        [1.0, 0.0],
        [0.5, 0.5],  # equal
        [2.0, 2.0, 1.0],  # tie for the best
        [1.0] * 4,  # equal
        [discrete[randint(0, 4)] for _ in range(5)],  # ties likely
        torch.randn(3, generator=gen, dtype=torch.float64).tolist(),
    ]
    ids = torch.randperm(1000, generator=gen)[: len(groups)].tolist()
    scores = [s for g in groups for s in g]
    group_ids = [i for i, g in zip(ids, groups) for _ in g]
    n = len(scores)
    lengths = torch.randint(0, RESPONSE_LEN + 1, (n,), generator=gen)
    forced = torch.randperm(n, generator=gen)[:2]
    lengths[forced[0]], lengths[forced[1]] = 0, 1  # an empty and a one-token response
    mask = (torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None]).double()
    if holes:
        mask = mask * (torch.rand(n, RESPONSE_LEN, generator=gen) < 0.8)
    order = torch.randperm(n, generator=gen)
    scores_t = torch.tensor(scores, dtype=torch.float64)[order]
    mask = mask[order]
    logits = torch.randn(n, RESPONSE_LEN, VOCAB, generator=gen, dtype=torch.float64) * 2
    probs = logits.softmax(-1)
    sampled = torch.multinomial(probs.view(-1, VOCAB), 1, generator=gen).view(n, RESPONSE_LEN, 1)
    old_log_probs = probs.gather(-1, sampled).squeeze(-1).log()
    sum_pi_squared = (probs**2).sum(-1)
    # a certain token whose Σπ² rounds below 1: w = 1 − 2π + Σπ² is −1e-9 before the clamp
    certain = int((mask[:, 0] > 0).nonzero()[0])
    old_log_probs[certain, 0], sum_pi_squared[certain, 0] = 0.0, 1 - 1e-9
    rewards = scores_to_token_rewards(scores_t, mask)
    rewards = rewards + 0.3 * torch.randn(n, RESPONSE_LEN, generator=gen, dtype=torch.float64) * mask * (
        seed % 2
    )
    return dict(
        scores=scores_t,
        group_ids=torch.tensor(group_ids)[order],
        mask=mask,
        token_rewards=rewards,
        old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=(torch.rand(n, RESPONSE_LEN, generator=gen, dtype=torch.float64) * 2),
    )


def members(case: dict) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(case["group_ids"].tolist()):
        rows.setdefault(g, []).append(i)
    return rows


def on_tokens(per_seq: list[float], mask: torch.Tensor) -> list[list[float]]:
    return [[a if m > 0 else 0.0 for m in row] for a, row in zip(per_seq, mask.tolist())]


def check(got: torch.Tensor, expected: list[list[float]], case: dict) -> None:
    """float64 against the loop at 1e-12; padding exactly 0."""
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert torch.all(got[case["mask"] == 0] == 0)


def check_fp32(estimator, case: dict, inputs: tuple[str, ...], **options) -> None:
    """fp32 inputs give fp32 outputs within 1e-5 of the float64 result on the same (rounded) inputs."""
    rounded = {k: case[k].float() if case[k].is_floating_point() else case[k] for k in inputs}
    got, _ = estimator(**rounded, **options)
    want, _ = estimator(
        **{k: v.double() if v.is_floating_point() else v for k, v in rounded.items()}, **options
    )
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6)


def reference_passk(case: dict, norm_by_std: bool, eps: float = 1e-6) -> list[float]:
    scores = case["scores"].tolist()
    adv = [0.0] * len(scores)
    for rows in members(case).values():
        group = [scores[i] for i in rows]
        for i in rows:
            if len(rows) == 1:
                a, std = scores[i], 1.0
            else:
                others = [scores[j] for j in rows if j != i]
                a, std = max(group) - max(others), statistics.stdev(group)
            adv[i] = a / (std + eps) if norm_by_std else a
    return adv


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_passk_rewards_only_the_unique_best(seed, norm_by_std):
    case = random_case(seed)
    adv, ret = grpo_passk(case["scores"], case["group_ids"], case["mask"], norm_by_std=norm_by_std)
    check(adv, on_tokens(reference_passk(case, norm_by_std), case["mask"]), case)
    assert ret is adv
    check_fp32(grpo_passk, case, ("scores", "group_ids", "mask"), norm_by_std=norm_by_std)


def test_grpo_passk_tie_for_the_best_gives_nobody_an_advantage():
    mask = torch.ones(5, 2)
    adv, _ = grpo_passk(torch.tensor([2.0, 1.0, 2.0, 3.0, 0.0]), torch.tensor([1, 1, 1, 4, 4]), mask)
    assert torch.all(adv[:3] == 0)
    assert adv[3, 0].item() == pytest.approx(3.0 / (math.sqrt(4.5) + 1e-6)) and torch.all(adv[4] == 0)


def reference_opo(case: dict) -> list[float]:
    scores = case["scores"].tolist()
    lengths = [sum(1 for m in row if m > 0) for row in case["mask"].tolist()]
    adv = [0.0] * len(scores)
    for rows in members(case).values():
        total = sum(lengths[i] for i in rows)
        if len(rows) == 1 or total == 0:
            baseline = 0.0
        else:
            baseline = sum(lengths[i] * scores[i] for i in rows) / total
        for i in rows:
            adv[i] = scores[i] - baseline
    return adv


@pytest.mark.parametrize("seed", SEEDS)
def test_opo_subtracts_the_length_weighted_group_mean(seed):
    case = random_case(seed)
    adv, ret = opo(case["scores"], case["group_ids"], case["mask"])
    check(adv, on_tokens(reference_opo(case), case["mask"]), case)
    assert ret is adv
    check_fp32(opo, case, ("scores", "group_ids", "mask"))


def reference_gpg(case: dict, norm_by_std: bool, eps: float = 1e-6) -> list[float]:
    scores = case["scores"].tolist()
    centred = [0.0] * len(scores)
    invalid = 0  # the paper's M: samples whose group yields no gradient
    for rows in members(case).values():
        group = [scores[i] for i in rows]
        mean, std = (statistics.fmean(group), statistics.stdev(group)) if len(rows) > 1 else (0.0, 1.0)
        for i in rows:
            centred[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
        if all(centred[i] == 0 for i in rows):
            invalid += len(rows)
    alpha = len(scores) / max(len(scores) - invalid, 1)
    return [alpha * a for a in centred]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [False, True])
def test_gpg_scales_the_group_centred_score_by_batch_over_valid_samples(seed, norm_by_std):
    case = random_case(seed)
    adv, ret = gpg(case["scores"], case["group_ids"], case["mask"], norm_by_std=norm_by_std)
    check(adv, on_tokens(reference_gpg(case, norm_by_std), case["mask"]), case)
    assert ret is adv
    check_fp32(gpg, case, ("scores", "group_ids", "mask"), norm_by_std=norm_by_std)


def test_gpg_alpha_counts_the_samples_of_groups_that_give_a_gradient():
    # group 1 unequal (valid), group 2 all equal, group 3 a lone 0: α = 5 / 2 (verl's B / nonzero = 5 / 3)
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    adv, _ = gpg(scores, torch.tensor([1, 1, 2, 2, 3]), torch.ones(5, 1))
    assert adv[:, 0].tolist() == [1.25, -1.25, 0.0, 0.0, 0.0]


def reference_otb(case: dict, use_is: bool, eps: float = 1e-8) -> tuple[list[list[float]], list[list[float]]]:
    mask = case["mask"].tolist()
    rewards = case["token_rewards"].tolist()
    logp, sq = case["old_log_probs"].tolist(), case["sum_pi_squared"].tolist()
    rho = case["rollout_is_weights"].tolist()
    n, length = len(mask), len(mask[0])
    returns = [[0.0] * length for _ in range(n)]
    path = [[0.0] * length for _ in range(n)]
    for i in range(n):
        running = 0.0
        for t in reversed(range(length)):
            if mask[i][t] > 0:
                running += rewards[i][t]
                returns[i][t] = running
        total = 0.0
        for t in range(length):
            if mask[i][t] > 0:
                w = max(0.0, 1 - 2 * math.exp(logp[i][t]) + sq[i][t]) * (rho[i][t] ** 2 if use_is else 1.0)
                total += w
                path[i][t] = total
    adv = [[0.0] * length for _ in range(n)]
    for rows in members(case).values():
        for t in range(length):
            running = [i for i in rows if mask[i][t] > 0]
            if not running:
                continue
            values = [returns[i][t] for i in running]
            if len(rows) == 1:
                baseline = 0.0
            elif len(set(values)) == 1:
                baseline = values[0]
            else:
                baseline = sum(returns[i][t] * path[i][t] for i in running) / (
                    sum(path[i][t] for i in running) + eps
                )
            for i in running:
                adv[i][t] = returns[i][t] - baseline
    return adv, returns


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("use_is", [False, True])
def test_optimal_token_baseline_weights_returns_by_path_gradient_norm(seed, holes, use_is):
    case = random_case(seed, holes)
    inputs = ("token_rewards", "old_log_probs", "sum_pi_squared", "group_ids", "mask")
    weights = case["rollout_is_weights"] if use_is else None
    adv, ret = optimal_token_baseline(*(case[k] for k in inputs), rollout_is_weights=weights)
    ref_adv, ref_ret = reference_otb(case, use_is)
    check(adv, ref_adv, case)
    check(ret, ref_ret, case)
    check_fp32(optimal_token_baseline, case, inputs + (("rollout_is_weights",) if use_is else ()))


def test_optimal_token_baseline_with_outcome_rewards_by_hand():
    # one group, lengths 2 and 3, scores 1 and 0; w = 1 − 2π + Σπ² = 0.5 everywhere: W_t = 0.5 (t + 1)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    rewards = scores_to_token_rewards(torch.tensor([1.0, 0.0], dtype=torch.float64), mask)
    log_probs = torch.full((2, 3), math.log(0.25), dtype=torch.float64)
    adv, ret = optimal_token_baseline(
        rewards, log_probs, torch.zeros(2, 3), torch.tensor([3, 3]), mask, eps=0.0
    )
    # both running at t = 0, 1 with equal W: B = (1 + 0) / 2; at t = 2 only row 1 runs: A = 0
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64))


def test_new_estimators_run_by_name_and_name_what_they_miss():
    case = random_case(0)
    for name in ("grpo_passk", "opo", "gpg", "optimal_token_baseline"):
        adv, ret = compute_advantages(name, **case, values=None, gamma=1.0, lam=1.0)
        assert adv.shape == ret.shape == case["mask"].shape
    with pytest.raises(TypeError, match="'optimal_token_baseline' needs old_log_probs, sum_pi_squared"):
        compute_advantages(
            "optimal_token_baseline",
            token_rewards=case["token_rewards"],
            group_ids=case["group_ids"],
            mask=case["mask"],
        )
