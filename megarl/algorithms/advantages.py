"""Advantage estimators: from rewards (and values) of a batch of responses to per-token advantages.

Every estimator returns `(advantages, returns)`, both [batch, response_len] and 0 on padding. Inputs:
`token_rewards` [batch, len] (a sequence's score sits on its last real token, see
`scores_to_token_rewards`), `values` [batch, len] from the critic, `scores` [batch] one number per
sequence, `group_ids` [batch] int64 (samples of one prompt share an id, in any order), and `mask`
[batch, len] (1 = real response token). Padding positions are skipped by the recursions over time, so
the value after a response's last real token is 0.

Pick one by name with `compute_advantages(name, **inputs)`; `ESTIMATORS` lists the names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from megarl.algorithms.aggregate import masked_whiten

Advantages = tuple[torch.Tensor, torch.Tensor]


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
    advantages = _zero_padding(advantages, mask)
    returns = _zero_padding(advantages + values, mask)
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

    The std is unbiased (like torch.std); a group whose scores are all equal gets advantage 0. A group of
    a single sample has no baseline: mean 0 and std 1 (verl's convention), so its advantage is its score
    (/(1 + eps)). `norm_by_std=False` skips the division (Dr.GRPO).
    """
    count, mean, std = _group_moments(scores, group_ids)
    single = count == 1
    advantage = scores - torch.where(single, 0.0, mean)
    if norm_by_std:
        advantage = advantage / (torch.where(single, 1.0, std) + eps)
    advantages = _broadcast(advantage, mask)
    return advantages, advantages


def drgrpo(scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """Dr.GRPO (Liu et al. 2025): score − group mean, not divided by the group std."""
    return grpo(scores, group_ids, mask, norm_by_std=False)


@torch.no_grad()
def rloo(scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """REINFORCE leave-one-out: r_i − mean of the other samples' scores in its group; returns = advantages.

    A sample alone in its group keeps its score r_i.
    """
    count, mean, _ = _group_moments(scores, group_ids)
    others = count - 1
    baseline = torch.where(others > 0, (mean * count - scores) / others.clamp(min=1), 0.0)
    advantages = _broadcast(scores - baseline, mask)
    return advantages, advantages


@torch.no_grad()
def reinforce_plus_plus(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> Advantages:
    """REINFORCE++: the discounted return-to-go of every token, whitened over the masked batch.

    returns = the return-to-go before whitening.
    """
    returns = _returns_to_go(token_rewards, mask, gamma)
    return masked_whiten(returns, mask), returns


@torch.no_grad()
def reinforce_plus_plus_baseline(
    scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor
) -> Advantages:
    """REINFORCE++ with a group baseline: score − group mean on every token, whitened over the masked
    batch; returns = advantages. A sample alone in its group has baseline 0."""
    count, mean, _ = _group_moments(scores, group_ids)
    centered = _broadcast(scores - torch.where(count == 1, 0.0, mean), mask)
    advantages = masked_whiten(centered, mask)
    return advantages, advantages


@torch.no_grad()
def remax(token_rewards: torch.Tensor, baseline_scores: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """ReMax (Li et al. 2023): return-to-go (γ = 1) minus the score of the greedy response to the same
    prompt (`baseline_scores` [batch]); returns = the return-to-go."""
    returns = _returns_to_go(token_rewards, mask, 1.0)
    return _zero_padding(returns - baseline_scores[:, None], mask), returns


def scores_to_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token rewards [batch, len]: each sequence's score on its last real token, 0 elsewhere (a row
    without real tokens gets nothing)."""
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


def _group_moments(
    scores: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: (size, mean, unbiased std) of its group; std is 0 for a group of one."""
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0

    def group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, group, x)[group]

    count = group_sum(torch.ones_like(scores))
    mean = group_sum(scores) / count
    squares = group_sum((scores - mean) ** 2)
    std = torch.sqrt(torch.where(count > 1, squares / (count - 1).clamp(min=1), 0.0))
    return count, mean, std


def _returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    real = mask > 0
    running = torch.zeros_like(token_rewards[:, 0])
    returns = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[-1])):
        running = torch.where(real[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return _zero_padding(returns, mask)


def _broadcast(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _zero_padding(per_sequence[:, None].expand(mask.shape), mask)


def _zero_padding(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, tokens, 0.0)
