"""megarl's RoPE kernels against megatron's unfused RoPE: values and gradients, whole rotary and partial,
one batch (BSHD) and packed sequences (THD)."""

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

from megarl.models.rotary import apply_rope_bshd, apply_rope_thd

pytestmark = pytest.mark.unit


def _freqs(length: int, rot: int) -> torch.Tensor:
    """[length, 1, 1, rot], as megatron's RotaryEmbedding builds them (the half-angles twice)."""
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    half = torch.outer(torch.arange(length, dtype=torch.float32), inv)
    return torch.cat([half, half], dim=-1)[:, None, None, :]


def _values_and_grads(fn, t: torch.Tensor, seed: int = 1):
    t = t.detach().requires_grad_()
    out = fn(t)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (grad,) = torch.autograd.grad(out, t, g)
    return out.detach(), grad


@pytest.mark.parametrize("rot", [16, 8])  # the whole head dim, and partial rotary (the rest passes)
def test_bshd_equals_megatrons_unfused_rope(rot):
    t = torch.randn(7, 2, 3, 16, generator=torch.Generator().manual_seed(0))
    freqs = _freqs(9, rot)  # longer than the sequence, as megatron's cached table
    got = _values_and_grads(lambda x: apply_rope_bshd(x, freqs), t)
    expected = _values_and_grads(lambda x: _apply_rotary_pos_emb_bshd(x, freqs[:7]), t)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if rot < 16:  # the pass-through channels: unchanged, gradient passed through
        torch.testing.assert_close(got[0][..., rot:], t[..., rot:], rtol=0, atol=0)


def test_thd_rotates_each_sequence_from_position_zero():
    lengths = [5, 3, 3, 1]
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    t = torch.randn(sum(lengths), 4, 8, generator=torch.Generator().manual_seed(0))
    freqs = _freqs(6, 8)
    got = _values_and_grads(lambda x: apply_rope_thd(x, cu, freqs), t)

    def per_sequence(x):
        parts = x.split(lengths)
        return torch.cat([_apply_rotary_pos_emb_bshd(p[:, None], freqs[: len(p)])[:, 0] for p in parts])

    expected = _values_and_grads(per_sequence, t)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_thd_takes_per_token_frequencies_as_they_are():
    """megatron's exact mapping: a table as long as the row gives each token its own frequencies."""
    lengths = [4, 2]
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    t = torch.randn(6, 2, 8, generator=torch.Generator().manual_seed(0))
    freqs = _freqs(6, 8).flip(0)  # not positions within a sequence
    got = apply_rope_thd(t, cu, freqs)
    expected = _apply_rotary_pos_emb_bshd(t[:, None], freqs)[:, 0]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_interleaved_rotary_is_refused():
    with pytest.raises(ValueError, match="non-interleaved"):
        apply_rope_bshd(torch.zeros(2, 1, 1, 4), _freqs(2, 4), interleaved=True)
