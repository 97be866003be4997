"""megarl's SDPA core attention on packed (THD) sequences: one causal call per run of equal lengths."""

import pytest
import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams

from megarl.models.sdpa_attention import SdpaDotProductAttention, _causal_thd, _runs

pytestmark = pytest.mark.unit


def test_runs_group_consecutive_equal_lengths():
    assert _runs([5, 5, 3, 3, 3, 5, 1]) == [(5, 2), (3, 3), (5, 1), (1, 1)]
    assert _runs([]) == []


def _params(cu: list[int], kv: list[int] | None = None, **padded) -> PackedSeqParams:
    q, k = torch.tensor(cu, dtype=torch.int32), torch.tensor(kv or cu, dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=q, cu_seqlens_kv=k, **padded)


def test_only_packed_self_attention_of_whole_sequences_takes_the_packed_path():
    assert _causal_thd(_params([0, 3, 5]))
    assert not _causal_thd(_params([0, 3, 5], [0, 2, 5]))
    assert not _causal_thd(_params([0, 3, 5], cu_seqlens_q_padded=torch.tensor([0, 4, 6])))


def test_packed_attention_equals_each_sequence_attended_alone():
    heads, kv_heads, dim = 4, 2, 8
    lengths = [6, 6, 4, 4, 4, 1, 3]  # longest first as megarl packs, then the trailing padding
    total = sum(lengths)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(total, heads, dim, generator=g, requires_grad=True)
    k = torch.randn(total, kv_heads, dim, generator=g, requires_grad=True)
    v = torch.randn(total, kv_heads, dim, generator=g, requires_grad=True)
    attention = SdpaDotProductAttention.__new__(SdpaDotProductAttention)  # _packed reads two attributes
    attention.softmax_scale, attention.hidden_size_per_partition = dim**-0.5, heads * dim
    cu = torch.tensor([0, *lengths]).cumsum(0).tolist()
    got = attention._packed(q, k, v, _params(cu))

    expected = []
    for start, end in zip(cu, cu[1:]):
        one = [t[start:end].transpose(0, 1)[None] for t in (q, k, v)]  # [1, heads, length, dim]
        o = F.scaled_dot_product_attention(*one, is_causal=True, scale=dim**-0.5, enable_gqa=True)
        expected.append(o[0].transpose(0, 1).reshape(end - start, heads * dim))
    expected = torch.cat(expected)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
