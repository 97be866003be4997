"""PF-PPO, Policy Filtration for PPO (Zhang et al. 2024, arXiv:2409.06957, ICML 2025; verl's
compute_pf_ppo_reweight_data, algorithm.pf_ppo).

Before the policy update the batch is resampled, with replacement and to the same size, with
probabilities proportional to weights of the sequences' scores, so the update sees more of the
responses whose reward is reliable. `pf_ppo_resample` gives the row indices of the new batch; the
trainer selects those rows.
"""

from __future__ import annotations

import torch

from megarl.algorithms.groups import Groups

REWEIGHT_METHODS = ("pow", "max_min", "max_random")

# every sample keeps a little probability, so a batch of all-zero weights is sampled uniformly (verl's floor)
WEIGHT_FLOOR = 1e-8


def pf_ppo_weights(
    scores: torch.Tensor,
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    group_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Unnormalised sampling weights [batch] (float64) of per-sequence `scores` [batch], each + 1e-8:

    - "pow": |score| ** weight_pow
    - "max_min": 1 for the highest and the lowest score, 0 for the rest (the paper's best-worst)
    - "max_random": 0.4 for the highest score, 0.1 for the rest (best-random)

    Highest and lowest are over the batch (verl), or over each prompt's samples when `group_ids` is
    given (the paper filters the N responses of each prompt); ties all count.
    """
    if reweight_method not in REWEIGHT_METHODS:
        raise ValueError(
            f"unknown PF-PPO reweight_method {reweight_method!r}; use one of {', '.join(REWEIGHT_METHODS)}"
        )
    if weight_pow < 0:
        raise ValueError(
            f"PF-PPO weight_pow={weight_pow} must be ≥ 0 (a zero score would get infinite weight)"
        )
    scores = scores.double()
    if reweight_method == "pow":
        weights = scores.abs() ** weight_pow
    else:
        if group_ids is None:
            highest, lowest = scores.max(), scores.min()
        else:
            groups = Groups.of(group_ids)
            highest, lowest = groups.max(scores), groups.min(scores)
        if reweight_method == "max_min":
            weights = ((scores == highest) | (scores == lowest)).double()
        else:
            weights = torch.full_like(scores, 0.1).masked_fill(scores == highest, 0.4)
    return weights + WEIGHT_FLOOR


def pf_ppo_resample(
    scores: torch.Tensor,
    generator: torch.Generator,
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    group_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row indices [batch] (long) of the resampled batch: as many draws as rows, with replacement, row i
    with probability pf_ppo_weights(...)[i] / Σ weights. `generator` makes the draw reproducible."""
    if scores.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=scores.device)
    weights = pf_ppo_weights(scores, reweight_method, weight_pow, group_ids)
    return torch.multinomial(weights, scores.numel(), replacement=True, generator=generator)
