"""A small hand-made batch shared by the algorithm tests: responses of different lengths, one empty."""

from __future__ import annotations

import pytest
import torch

LENGTHS = [5, 3, 1, 0, 4, 2, 5]  # response lengths; row 3 has no real token
RESPONSE_LEN = 5


def mask_of(lengths: list[int], response_len: int = RESPONSE_LEN) -> torch.Tensor:
    """[batch, response_len] float64 mask with `lengths[i]` leading ones in row i."""
    return torch.tensor(
        [[1.0 if t < n else 0.0 for t in range(response_len)] for n in lengths], dtype=torch.float64
    )


@pytest.fixture
def mask() -> torch.Tensor:
    return mask_of(LENGTHS)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)
