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


def row_factors(lengths: list[int], mode: str, num_seqs: int | None = None, horizon: int = RESPONSE_LEN):
    """d(aggregated loss) / d(one token's loss) for each row under `mode`, written from its definition."""
    seqs = sum(n > 0 for n in lengths) if num_seqs is None else num_seqs  # rows with tokens, as verl
    if mode == "token-mean":
        return [1 / sum(lengths)] * len(lengths)
    if mode == "seq-mean-token-mean":
        return [1 / (n * seqs) if n else 0.0 for n in lengths]
    if mode == "seq-mean-token-sum":
        return [1 / seqs] * len(lengths)
    assert mode == "seq-mean-token-sum-norm"
    return [1 / (seqs * horizon)] * len(lengths)
