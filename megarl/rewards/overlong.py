"""DAPO's soft overlong punishment, a pure function of response lengths."""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, max_response_length: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """Per-response penalty (≤ 0): 0 up to `max_response_length - buffer_len` tokens, then falling
    linearly to -`penalty_factor` at `max_response_length` (DAPO, Yu et al. 2025, eq. 13)."""
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(f"buffer_len={buffer_len} must be in [1, max_response_length={max_response_length}]")
    expected = max_response_length - buffer_len
    exceed = lengths.float() - expected
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)
