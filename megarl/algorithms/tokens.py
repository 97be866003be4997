"""Per-token placement shared by the advantage estimators: a sequence's value on each of its response
tokens, discounted returns-to-go, and 0 on padding. Tensors are [batch, response_len] with a `mask` of
the same shape (1 = real response token: a generated one; a multi-turn response's tool outputs and user
turns are 0, holes that the recursions step over without resetting)."""

from __future__ import annotations

import torch


def on_tokens(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[batch] -> [batch, len]: each sequence's value on its real tokens, 0 on padding."""
    return zero_padding(per_sequence[:, None].expand(mask.shape), mask)


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + γ·G_next at every real token, G_next being the return at the next real token (0 after
    the last one); padding, also a hole inside a response, is skipped and is 0 in the result."""
    real = mask > 0
    running = torch.zeros_like(token_rewards[:, 0])
    returns = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[-1])):
        running = torch.where(real[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return zero_padding(returns, mask)


def zero_padding(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`tokens` where the mask is set, 0 elsewhere (nan or inf at padding do not survive)."""
    return torch.where(mask > 0, tokens, 0.0)
