"""Advantage estimators: from rewards (and values) of a batch of responses to per-token advantages.

Every estimator returns `(advantages, returns)`, both [batch, response_len] and 0 on padding. Inputs:
`token_rewards` [batch, len] (a sequence's score sits on its last real token, see
`scores_to_token_rewards`), `values` [batch, len] from the critic, `scores` [batch] one number per
sequence, `group_ids` [batch] int64 (samples of one prompt share an id, in any order), `mask`
[batch, len] (1 = real response token), and for the optimal token baseline the actor's `old_log_probs`
and `sum_pi_squared` [batch, len]. Padding positions are skipped by the recursions over time, so
the value after a response's last real token is 0.

Estimators that compare the samples of one prompt compute their group statistics in float64
(`groups.group_stats`): a group whose scores are all equal gets advantage exactly 0 (before
reinforce_plus_plus_baseline's batch whitening), and the outputs have the inputs' dtype.
`group_advantages` holds the newer group estimators (GRPO pass@k, OPO, GPG, optimal token baseline).

Pick one by name with `compute_advantages(name, **inputs)`; `ESTIMATORS` lists the names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from megarl.algorithms.aggregate import masked_whiten
from megarl.algorithms.group_advantages import Advantages, gpg, grpo_passk, opo, optimal_token_baseline
from megarl.algorithms.groups import group_stats
from megarl.algorithms.tokens import on_tokens, returns_to_go, zero_padding


@torch.no_grad()
def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> Advantages:
    """Generalized advantage estimation (Schulman et al. 2016) over the masked tokens.

    returns = advantages + values (before whitening); the advantages are whitened over the masked batch
    when `whiten`.
    """
    real = mask > 0
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = torch.where(real[:, t], values[:, t], next_value)
        next_advantage = torch.where(real[:, t], advantage, next_advantage)
        advantages[:, t] = advantage
    advantages = zero_padding(advantages, mask)
    returns = zero_padding(advantages + values, mask)
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


@torch.no_grad()
def grpo(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Advantages:
    """GRPO: (score − group mean) / (group std + eps) on every token of the response; returns = advantages.

    The std is unbiased (like torch.std); a group whose scores are all equal gets advantage exactly 0. A
    group of a single sample has no baseline: mean 0 and std 1 (verl's convention), so its advantage is its
    score (/(1 + eps)). `norm_by_std=False` skips the division (Dr.GRPO).
    """
    stats = group_stats(scores, group_ids)
    single = stats.count == 1
    advantage = scores.double() - torch.where(single, 0.0, stats.mean)
    if norm_by_std:
        advantage = advantage / (torch.where(single, 1.0, stats.std) + eps)
    advantages = on_tokens(advantage.to(scores.dtype), mask)
    return advantages, advantages


def drgrpo(scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """Dr.GRPO (Liu et al. 2025): score − group mean, not divided by the group std."""
    return grpo(scores, group_ids, mask, norm_by_std=False)


@torch.no_grad()
def rloo(scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """REINFORCE leave-one-out: r_i − mean of the other samples' scores in its group; returns = advantages.

    A sample alone in its group keeps its score r_i; an all-equal group gets exactly 0.
    """
    stats = group_stats(scores, group_ids)
    others = stats.count - 1
    scores64 = scores.double()
    leave_one_out = torch.where(stats.equal, scores64, (stats.sum(scores64) - scores64) / others.clamp(min=1))
    advantage = scores64 - torch.where(others > 0, leave_one_out, 0.0)
    advantages = on_tokens(advantage.to(scores.dtype), mask)
    return advantages, advantages


@torch.no_grad()
def reinforce_plus_plus(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> Advantages:
    """REINFORCE++: the discounted return-to-go of every token, whitened over the masked batch.

    returns = the return-to-go before whitening.
    """
    returns = returns_to_go(token_rewards, mask, gamma)
    return masked_whiten(returns, mask), returns


@torch.no_grad()
def reinforce_plus_plus_baseline(
    scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor
) -> Advantages:
    """REINFORCE++ with a group baseline: score − group mean on every token, whitened over the masked
    batch; returns = advantages. A sample alone in its group has baseline 0.

    An all-equal group is centred to exactly 0, so after whitening (which, as in the paper, subtracts the
    batch's token mean) all its tokens hold the same value −mean/std whatever its scores.
    """
    stats = group_stats(scores, group_ids)
    centered = scores.double() - torch.where(stats.count == 1, 0.0, stats.mean)
    advantages = masked_whiten(on_tokens(centered.to(scores.dtype), mask), mask)
    return advantages, advantages


@torch.no_grad()
def remax(token_rewards: torch.Tensor, baseline_scores: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """ReMax (Li et al. 2023): return-to-go (γ = 1) minus the score of the greedy response to the same
    prompt (`baseline_scores` [batch]); returns = the return-to-go."""
    returns = returns_to_go(token_rewards, mask, 1.0)
    return zero_padding(returns - baseline_scores[:, None], mask), returns


def scores_to_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token rewards [batch, len]: each sequence's score on its last masked token, 0 elsewhere (a row
    without masked tokens gets nothing). With the response_mask that is the last generated token, also
    where a multi-turn response ends with tool output."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=-1).values
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores[rows]
    return rewards


ESTIMATORS: dict[str, Callable[..., Advantages]] = {
    "gae": gae,
    "grpo": grpo,
    "drgrpo": drgrpo,
    "rloo": rloo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "remax": remax,
    "grpo_passk": grpo_passk,
    "opo": opo,
    "gpg": gpg,
    "optimal_token_baseline": optimal_token_baseline,
}


def compute_advantages(name: str, **inputs: object) -> Advantages:
    """Run the estimator `name` on the inputs it takes; `inputs` may hold more (the trainer passes what it
    has: token_rewards, values, scores, group_ids, mask, gamma, lam, ...), extra ones are ignored."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; use one of {', '.join(ESTIMATORS)}")
    estimator = ESTIMATORS[name]
    params = inspect.signature(estimator).parameters
    missing = [p for p, spec in params.items() if spec.default is inspect.Parameter.empty and p not in inputs]
    if missing:
        raise TypeError(
            f"advantage estimator {name!r} needs {', '.join(missing)}; it takes {', '.join(params)}"
        )
    return estimator(**{k: v for k, v in inputs.items() if k in params})
