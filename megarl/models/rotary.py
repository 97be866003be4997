"""Rotary position embedding for the local (non-Transformer-Engine) layer spec: megatron's fused-RoPE
kernel slots, filled with a torch implementation where Transformer Engine's are absent.

megatron-core applies RoPE unfused without TE: per call the cos and sin of the [positions, d]
frequencies, `t · cos`, `_rotate_half` (chunk, neg, cat), `· sin`, the sum and a cat with the (empty)
pass-through part, plus autograd's backward of each — 78 ms per layer (query and key, forward +
backward) at a 25M model's 64 × 147 packed tokens, 1 thread. The rotation of each half is two
multiplies; here they are written straight into the output's halves, forward and backward:

    out₁ = t₁·cos₁ − t₂·sin₁      out₂ = t₂·cos₂ + t₁·sin₂
    dt₁  = g₁·cos₁ + g₂·sin₂      dt₂  = g₂·cos₂ − g₁·sin₁

Packed (THD) sequences get their positions' frequencies in one gather instead of a slice and a cat
per sequence. Megatron calls these through `config.apply_rope_fusion`: non-interleaved RoPE, which is
what the supported HF families use.

Megatron has one way in for a RoPE kernel: its attention calls `rope_utils.apply_rotary_pos_emb`, which
(with `config.apply_rope_fusion`) calls the kernels in rope_utils' module globals
`fused_apply_rotary_pos_emb(_thd)` — Transformer Engine's, filled when rope_utils is imported, or None.
No spec submodule, config field or argument reaches them. So `fill_megatron_rope_slots` puts these
kernels in the empty slots once per process, called only where the platform's spec provider is chosen
(`models/backends.spec_provider`); `rope_fusion_applies` then says whether a config may use them.
"""

from __future__ import annotations

import torch


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(t, cos, sin, sign=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, sign=-1), None, None


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    """sign 1: the rotation of t's first `cos.shape[-1]` channels (the rest copied); -1: its transpose
    (the backward: the same rotation by the negated angle, with the halves' sin swapped). The cos term
    is one multiply over the whole width (the halves' own would be two strided ones: slower)."""
    rot = cos.shape[-1]
    if rot == t.shape[-1]:
        out = torch.mul(t, cos)
    else:
        out = torch.empty_like(t)
        torch.mul(t[..., :rot], cos, out=out[..., :rot])
        out[..., rot:] = t[..., rot:]
    t1, t2 = t[..., :rot].chunk(2, dim=-1)
    o1, o2 = out[..., :rot].chunk(2, dim=-1)
    s1, s2 = sin.chunk(2, dim=-1)
    if sign < 0:
        s1, s2 = s2, s1
    o1.addcmul_(t2, s1, value=-sign)
    o2.addcmul_(t1, s2, value=sign)
    return out


def apply_rope_bshd(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """megatron's `fused_apply_rotary_pos_emb`: t [s, b, heads, d], freqs [s, 1, 1, rot ≤ d]."""
    if interleaved:
        raise ValueError("megarl's RoPE kernel covers non-interleaved rotary only")
    return _rotate_by(t, freqs[: t.shape[0]])


def apply_rope_thd(
    t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1, cp_rank: int = 0
) -> torch.Tensor:
    """megatron's `fused_apply_rotary_pos_emb_thd`: t [tokens, heads, d] of whole sequences back to back
    at `cu_seqlens`; freqs [max length, 1, 1, rot] by position within a sequence, or [tokens, 1, 1, rot]
    by position in the row (megatron's two cases, told apart by length the same way)."""
    if cp_size > 1:
        freqs = _cp_freqs(t, cu_seqlens, freqs, cp_size, cp_rank)
    elif freqs.shape[0] != cu_seqlens[-1]:
        starts = cu_seqlens[:-1].long()
        lengths = cu_seqlens.diff().long()
        position = torch.arange(t.shape[0], device=t.device) - starts.repeat_interleave(lengths)
        freqs = freqs[position]
    return _rotate_by(t, freqs.squeeze(1))  # [tokens, 1, rot]: broadcast over the heads


def _rotate_by(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    return _Rotate.apply(t, freqs.cos().to(t.dtype), freqs.sin().to(t.dtype))


def _cp_freqs(t, cu_seqlens, freqs, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Each sequence's two context-parallel chunks' frequencies, as megatron slices them."""
    from megatron.core.models.common.embeddings.rope_utils import _get_thd_freqs_on_this_cp_rank

    lengths = (cu_seqlens.diff() // cp_size).tolist()
    exact = freqs.shape[0] == cu_seqlens[-1]
    return torch.cat(
        [
            _get_thd_freqs_on_this_cp_rank(cp_rank, cp_size, x, freqs, int(start) if exact else 0)
            for x, start in zip(torch.split(t, lengths), cu_seqlens[:-1].tolist())
        ]
    )


def fill_megatron_rope_slots() -> None:
    """Put these kernels in megatron's fused-RoPE slots where Transformer Engine left them empty."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = apply_rope_bshd
    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = apply_rope_thd


def rope_fusion_applies(config) -> bool:
    """Whether megatron's fused-RoPE slots hold these kernels and `config`'s rotary is one they compute
    (then the spec provider sets `config.apply_rope_fusion`)."""
    from megatron.core.models.common.embeddings import rope_utils

    return (
        rope_utils.fused_apply_rotary_pos_emb is apply_rope_bshd
        and rope_utils.fused_apply_rotary_pos_emb_thd is apply_rope_thd
        and not config.rotary_interleaved
        and not config.multi_latent_attention
        and config.mrope_section is None
    )
