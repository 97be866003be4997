"""DAPO's dynamic-sampling filter, a pure function: which rows belong to groups worth training on."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def varied_groups(scores: torch.Tensor, group_ids: torch.Tensor | np.ndarray | Sequence[Any]) -> torch.Tensor:
    """[n] bool: True for the rows of groups (the samples of one prompt, by `group_ids`) whose scores are
    not all equal. A group with one sample is kept (verl's rule); an all-equal group has zero advantage
    under GRPO and teaches nothing, so DAPO drops it and generates more prompts to fill the batch."""
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor | np.ndarray) else list(group_ids)
    if len(ids) != len(scores):
        raise ValueError(f"{len(ids)} group ids for {len(scores)} scores")
    rows: dict[Any, list[int]] = defaultdict(list)
    for row, gid in enumerate(ids):
        rows[gid].append(row)
    keep = torch.zeros(len(ids), dtype=torch.bool)
    for members in rows.values():
        values = scores[members]
        if len(members) == 1 or bool((values != values[0]).any()):
            keep[members] = True
    return keep
