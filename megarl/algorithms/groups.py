"""Statistics over groups of samples (the responses to one prompt, which share a group id), per sample.

Everything is computed in float64, and a group whose scores are all equal is detected exactly, so an
estimator can give such a group an advantage of exactly 0 whatever its value and size: in fp32 the mean
of sixteen 5.1s is one ulp off 5.1, and dividing by (std + eps) would blow that ulp up to 0.3.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Groups:
    """Which group each sample [batch] belongs to; the methods reduce a per-sample tensor [batch, ...]
    over each group and hand every sample its group's result, in float64."""

    index: torch.Tensor  # [batch] long: the sample's group, numbered 0 .. n_groups − 1
    n_groups: int
    count: torch.Tensor  # [batch] float64: samples in the sample's group

    @classmethod
    def of(cls, group_ids: torch.Tensor) -> Groups:
        """The groups of `group_ids` [batch] (any integer ids, in any order)."""
        _, index = torch.unique(group_ids, return_inverse=True)
        n_groups = int(index.max()) + 1 if index.numel() else 0
        count = _reduce(
            torch.ones(index.shape, dtype=torch.float64, device=index.device), index, n_groups, "sum"
        )
        return cls(index, n_groups, count)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return _reduce(values, self.index, self.n_groups, "sum")

    def max(self, values: torch.Tensor) -> torch.Tensor:
        """The group's largest value (−inf entries count as absent)."""
        return _reduce(values, self.index, self.n_groups, "amax")

    def min(self, values: torch.Tensor) -> torch.Tensor:
        """The group's smallest value (+inf entries count as absent)."""
        return _reduce(values, self.index, self.n_groups, "amin")


@dataclass(frozen=True)
class GroupStats(Groups):
    """Groups plus, per sample, its group's mean and unbiased std (like torch.std) of the scores, float64.

    Where `equal` (all of the group's scores are the same, also a group of one) `mean` is exactly the
    sample's own score and `std` is 0.
    """

    mean: torch.Tensor
    std: torch.Tensor
    equal: torch.Tensor  # bool


def group_stats(scores: torch.Tensor, group_ids: torch.Tensor) -> GroupStats:
    """The group statistics of per-sequence `scores` [batch]."""
    groups = Groups.of(group_ids)
    scores = scores.double()
    equal = groups.max(scores) == groups.min(scores)
    mean = torch.where(equal, scores, groups.sum(scores) / groups.count)
    squares = groups.sum((scores - mean) ** 2)
    std = torch.sqrt(torch.where(groups.count > 1, squares / (groups.count - 1).clamp(min=1), 0.0))
    return GroupStats(groups.index, groups.n_groups, groups.count, mean, torch.where(equal, 0.0, std), equal)


def _reduce(values: torch.Tensor, index: torch.Tensor, n_groups: int, how: str) -> torch.Tensor:
    values = values.double()
    rows = index.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    out = values.new_zeros((n_groups, *values.shape[1:]))
    return out.scatter_reduce_(0, rows, values, how, include_self=False)[index]
