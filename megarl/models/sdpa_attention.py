"""Megatron's core attention through torch's fused `scaled_dot_product_attention`, for the local
(non-Transformer-Engine) layer spec that runs on CPU.

megatron-core's own `DotProductAttention` materialises the [b, heads, s, s] scores: baddbmm, a
masked_fill of the mask, softmax, bmm, and the layout copies around them — 12–15% of a policy update on
CPU (`megarl bench train`, torch.profiler). SDPA does the same maths in one fused kernel (the one
transformers uses). Cases SDPA would compute differently (attention dropout in training, a softmax
offset, sliding windows, query-key layer scaling, attention bias) take the original path.

Packed sequences (THD: one row of whole sequences back to back, `PackedSeqParams.cu_seqlens_q`) are
attended without padding and without a mask: each run of consecutive sequences of one length is viewed
as a [count, length] batch (no copy) and gets one causal SDPA call. megarl packs a micro-batch's
sequences longest first (`build_microbatch`), so a run holds every sequence of its length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SdpaDotProductAttention(DotProductAttention):
    @property
    def handles_packed(self) -> bool:
        """Whether packed THD sequences take the fused path (in training too): megatron's own core
        attention has no THD support, so without it packed sequences need a block-causal mask."""
        return self.attention_dropout.p == 0 and self._fused(None, None)

    def _fused(self, attention_bias, packed_seq_params) -> bool:
        c = self.config
        return (
            attention_bias is None
            and (packed_seq_params is None or _causal_thd(packed_seq_params))
            and self.softmax_offset is None
            and getattr(c, "window_size", None) is None
            and not c.apply_query_key_layer_scaling
            and not (self.training and self.attention_dropout.p > 0)
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if not self._fused(attention_bias, packed_seq_params):
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        if packed_seq_params is not None:
            return self._packed(query, key, value, packed_seq_params)
        # [s, b, heads, d] -> [b, heads, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        # Megatron's mask is True where attention is NOT allowed; SDPA's boolean mask is the opposite.
        # Without a mask the layer is causal (the local spec's default mask) or unmasked.
        causal = attention_mask is None and mask_type == AttnMaskType.causal
        allowed = None if attention_mask is None else ~attention_mask
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=allowed,
            is_causal=causal,
            scale=self.softmax_scale,
            enable_gqa=q.size(1) != k.size(1),
        )
        # [b, heads, s, d] -> [s, b, heads · d]
        return out.permute(2, 0, 1, 3).reshape(out.size(2), out.size(0), self.hidden_size_per_partition)

    def _packed(self, query, key, value, packed_seq_params) -> torch.Tensor:
        """THD: query/key/value [t, heads, d] -> [t, heads · d], each sequence causal on its own."""
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        runs = _runs([end - start for start, end in zip(bounds, bounds[1:])])
        # one split per tensor, not a slice per run: a slice's backward writes its gradient into a
        # zeroed tensor of the whole row (and autograd sums those), a split's is one concatenation:
        # e2e 25m's packed update, 10 runs per micro-batch, 12.6 -> 11.6 s
        sizes = [length * count for length, count in runs]
        out = []
        for (length, count), q, k, v in zip(runs, *(t.split(sizes) for t in (query, key, value))):
            # [count · length, heads, d] -> [count, heads, length, d]: views of the packed row
            q, k, v = (t.unflatten(0, (count, length)).transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=q.size(1) != k.size(1)
            )
            out.append(o.transpose(1, 2).reshape(length * count, self.hidden_size_per_partition))
        return torch.cat(out) if len(out) > 1 else out[0]


def _causal_thd(packed_seq_params) -> bool:
    """Packed self-attention of whole sequences: the same boundaries for queries and keys, no padding
    inside a sequence (which TE's `*_padded` boundaries would describe)."""
    p = packed_seq_params
    return (
        p.qkv_format == "thd"
        and p.cu_seqlens_q_padded is None
        and p.cu_seqlens_kv_padded is None
        and torch.equal(p.cu_seqlens_q, p.cu_seqlens_kv)
    )


def _runs(lengths: list[int]) -> list[tuple[int, int]]:
    """[(length, count)] of consecutive equal lengths: [5, 5, 3] -> [(5, 2), (3, 1)]."""
    runs: list[tuple[int, int]] = []
    for n in lengths:
        if runs and runs[-1][0] == n:
            runs[-1] = (n, runs[-1][1] + 1)
        else:
            runs.append((n, 1))
    return runs
