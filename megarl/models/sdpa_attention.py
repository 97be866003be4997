"""Megatron's core attention through torch's fused `scaled_dot_product_attention`, for the local
(non-Transformer-Engine) layer spec that runs on CPU.

megatron-core's own `DotProductAttention` materialises the [b, heads, s, s] scores: baddbmm, a
masked_fill of the mask, softmax, bmm, and the layout copies around them — 12–15% of a policy update on
CPU (`megarl bench train`, torch.profiler). SDPA does the same maths in one fused kernel (the one
transformers uses). Cases SDPA would compute differently (attention dropout in training, a softmax
offset, sliding windows, query-key layer scaling, packed THD sequences, attention bias) take the
original path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SdpaDotProductAttention(DotProductAttention):
    def _fused(self, attention_bias, packed_seq_params) -> bool:
        c = self.config
        return (
            attention_bias is None
            and packed_seq_params is None
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
