"""Advantage estimators that compare the samples of one prompt: GRPO pass@k, OPO, GPG and the optimal
token baseline. Same contract as `advantages` (which registers them in ESTIMATORS): each returns
`(advantages, returns)` [batch, response_len], 0 on padding, in the dtype of its scores / rewards.

`scores` [batch] is one number per sequence, `group_ids` [batch] int64 (samples of one prompt share an
id, in any order), `mask` [batch, len] (1 = real response token). Group statistics are float64 and a
group whose scores are all equal gets advantage exactly 0. As in GRPO, a sample alone in its group has
baseline 0: its advantage is its own score.
"""

from __future__ import annotations

import torch

from megarl.algorithms.groups import Groups, group_stats
from megarl.algorithms.tokens import on_tokens, returns_to_go, zero_padding

Advantages = tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def grpo_passk(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Advantages:
    """GRPO for the pass@k objective (Tang et al. 2025, "Optimizing Language Models for Inference Time
    Objectives using Reinforcement Learning", arXiv:2503.19595; verl's compute_grpo_passk_outcome_advantage).

    The leave-one-out advantage of the group's best score: A_i = max_j r_j − max_{j≠i} r_j. Only a group's
    unique best response gets a non-zero advantage, best − second best; with a tie for the best nobody
    does. Divided by (group std + eps) when `norm_by_std` (verl's norm_adv_by_std_in_grpo). returns =
    advantages. A sample alone in its group gets its score (/(1 + eps)), where verl raises.
    """
    stats = group_stats(scores, group_ids)
    scores64 = scores.double()
    best = stats.max(scores64)
    is_best = scores64 == best
    runner_up = stats.max(torch.where(is_best, -torch.inf, scores64))  # −inf when the whole group ties
    unique_best = is_best & (stats.sum(is_best) == 1) & (stats.count > 1)
    single = stats.count == 1
    advantage = torch.where(single, scores64, torch.where(unique_best, best - runner_up, 0.0))
    if norm_by_std:
        advantage = advantage / (torch.where(single, 1.0, stats.std) + eps)
    advantages = on_tokens(advantage.to(scores.dtype), mask)
    return advantages, advantages


@torch.no_grad()
def opo(scores: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> Advantages:
    """OPO, On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585; verl's
    compute_opo_outcome_advantage): r_i − b on every token, with the length-weighted group baseline
    b = Σ_j |o_j| r_j / Σ_j |o_j| (|o_j| = real tokens of response j); returns = advantages. A group
    without any real token has baseline 0 (its rows are all padding anyway)."""
    stats = group_stats(scores, group_ids)
    scores64 = scores.double()
    lengths = (mask > 0).sum(-1).double()
    total = stats.sum(lengths)
    weighted = stats.sum(lengths * scores64) / torch.where(total > 0, total, 1.0)
    baseline = torch.where(stats.equal, scores64, torch.where(total > 0, weighted, 0.0))
    advantage = scores64 - torch.where(stats.count == 1, 0.0, baseline)
    advantages = on_tokens(advantage.to(scores.dtype), mask)
    return advantages, advantages


@torch.no_grad()
def gpg(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    norm_by_std: bool = False,
    eps: float = 1e-6,
) -> Advantages:
    """GPG, Group Policy Gradient (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning
    Baseline for Model Reasoning", arXiv:2504.02546): A_i = α · (r_i − mean_group(r)) / F_norm on every
    token; returns = advantages.

    F_norm = 1, or (group std + eps) when `norm_by_std`. α = B / max(B_valid, 1) (the paper's
    B / (B − M)) with B the number of samples and B_valid those whose group does give a gradient, i.e.
    whose advantages before α are not all 0: groups with unequal scores, and lone samples (baseline 0)
    with a non-zero score. verl's compute_gpg_outcome_advantage counts non-zero *scores* instead.
    """
    stats = group_stats(scores, group_ids)
    scores64 = scores.double()
    single = stats.count == 1
    advantage = scores64 - torch.where(single, 0.0, stats.mean)
    if norm_by_std:
        advantage = advantage / (torch.where(single, 1.0, stats.std) + eps)
    no_gradient = torch.where(single, scores64 == 0, stats.equal)
    alpha = scores.numel() / (~no_gradient).sum().clamp(min=1).double()
    advantages = on_tokens((alpha * advantage).to(scores.dtype), mask)
    return advantages, advantages


@torch.no_grad()
def optimal_token_baseline(
    token_rewards: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    eps: float = 1e-8,
) -> Advantages:
    """Optimal token baseline, OTB (Li et al. 2026, "The Optimal Token Baseline", arXiv:2602.07078; verl's
    compute_optimal_token_baseline_advantage): a baseline per token position and group that weights each
    response by the gradient energy its path has accumulated so far.

    G_{i,t} is the return-to-go (γ = 1) of `token_rewards`. With π_{i,j} = exp(old_log_probs), the
    probability of the sampled token, and Σπ² = `sum_pi_squared` (Σ_v π_v² of that position's
    distribution), w_{i,j} = 1 − 2π_{i,j} + Σπ² = ‖∇_logits log π‖² (the logit-gradient proxy), times
    ρ_{i,j}² when `rollout_is_weights` ρ are given. W_{i,t} = Σ_{j ≤ t, real} w_{i,j} and, over the
    responses i of the group that are real at t,

        B_t = Σ_i G_{i,t} W_{i,t} / (Σ_i W_{i,t} + eps),   A_{i,t} = G_{i,t} − B_t,   returns = G.

    Where all those G_{i,t} are equal (also where only one response is still running) B_t is that value
    exactly, so A = 0; a response alone in its group has B = 0 (A = G). w is clamped at 0: it is a squared
    norm, negative only by rounding when π ≈ 1, and verl's unclamped W ≈ −eps makes B explode there.
    """
    real = mask > 0
    returns = returns_to_go(token_rewards.double(), mask, 1.0)
    w = (1 - 2 * old_log_probs.double().exp() + sum_pi_squared.double()).clamp(min=0)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.double() ** 2
    path = torch.where(real, w, 0.0).cumsum(-1)
    weight = torch.where(real, path, 0.0)
    groups = Groups.of(group_ids)
    baseline = groups.sum(returns * weight) / (groups.sum(weight) + eps)
    highest = groups.max(torch.where(real, returns, -torch.inf))
    lowest = groups.min(torch.where(real, returns, torch.inf))
    baseline = torch.where(highest == lowest, returns, baseline)
    baseline = torch.where((groups.count == 1)[:, None], 0.0, baseline)
    advantages = zero_padding(returns - baseline, mask)
    return advantages.to(token_rewards.dtype), returns.to(token_rewards.dtype)
