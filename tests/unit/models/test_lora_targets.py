"""Which projections get adapters, their names and shapes, and the fused output layout (pure)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megarl.distributed.param_kind import ParamKind
from megarl.models.from_hf import ModelArchitecture
from megarl.models.lora.layers import assemble
from megarl.models.lora.merge import merge_into_hf
from megarl.models.lora.targets import PROJECTIONS, lora_tensors, megatron_to_peft, targeted


def settings(targets, excludes=(), rank=4):
    return SimpleNamespace(rank=rank, alpha=8, target_modules=list(targets), exclude_modules=list(excludes))


@pytest.mark.parametrize(
    ("targets", "excludes", "layer", "expected"),
    [
        (["all-linear"], [], 0, set(PROJECTIONS)),
        (["linear_qkv"], [], 1, {"q_proj", "k_proj", "v_proj"}),
        (["linear_fc1", "o_proj"], [], 0, {"gate_proj", "up_proj", "o_proj"}),
        (["all-linear"], ["linear_fc2", "k_proj"], 0, set(PROJECTIONS) - {"down_proj", "k_proj"}),
        (["*.layers.0.*.linear_qkv"], [], 0, {"q_proj", "k_proj", "v_proj"}),
        (["*.layers.0.*.linear_qkv"], [], 1, set()),
        (["model.layers.1.mlp.*"], [], 1, {"gate_proj", "up_proj", "down_proj"}),
        (["all-linear"], ["*.layers.1.*"], 1, set()),
    ],
)
def test_targets_by_hf_name_megatron_name_and_pattern(targets, excludes, layer, expected):
    cfg = settings(targets, excludes)
    assert {p for p in PROJECTIONS if targeted(cfg, layer, p)} == expected


def test_every_adapter_tensor_has_peft_name_full_shape_and_tp_layout(tmp_path):
    from megarl.models.tiny import build_tiny_hf

    arch = ModelArchitecture.from_pretrained(build_tiny_hf(tmp_path / "m", num_hidden_layers=2))
    tensors = lora_tensors(arch, settings(["all-linear"]))
    assert len(tensors) == 2 * 7 * 2
    by_name = {t.peft: t for t in tensors}
    q_b = by_name["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
    assert q_b.shape == (arch.num_heads * arch.head_dim, 4) and q_b.kind is ParamKind.COLUMN
    assert q_b.megatron == "decoder.layers.1.self_attention.linear_qkv.lora.q_proj.lora_B"
    down_a = by_name["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"]
    assert down_a.shape == (4, arch.ffn_hidden_size) and down_a.kind is ParamKind.ROW
    assert by_name["base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"].kind is ParamKind.REPLICATED
    assert (
        by_name["base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight"].kind is ParamKind.REPLICATED
    )
    for t in tensors:
        assert megatron_to_peft(t.megatron, arch, 4) == t


def test_fused_qkv_output_is_grouped_per_query_group_with_zeros_for_untargeted():
    """2 query groups of (2 q heads + k + v), head dim 1: the adapters' q and v outputs land where
    megatron's fused QKV output holds them."""
    linear = SimpleNamespace(
        lora={"q_proj": None, "v_proj": None},
        lora_layout=[("q_proj", 4), ("k_proj", 2), ("v_proj", 2)],
        lora_groups=2,
    )
    q = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    v = torch.tensor([[5.0, 6.0]])
    assert assemble(linear, [q, v]).tolist() == [[1.0, 2.0, 0.0, 5.0, 3.0, 4.0, 0.0, 6.0]]


def test_merge_into_hf_adds_the_scaled_product_to_targeted_weights_only():
    w = torch.randn(6, 5, dtype=torch.float64)
    a, b = torch.randn(2, 5, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    adapter = {
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": a,
        "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight": b,
    }
    other = torch.randn(3)
    merged = dict(
        merge_into_hf(
            [("model.layers.0.mlp.up_proj.weight", w), ("model.norm.weight", other)],
            adapter,
            SimpleNamespace(alpha=8, rank=2),
        )
    )
    torch.testing.assert_close(merged["model.layers.0.mlp.up_proj.weight"], w + 4 * b @ a)
    assert merged["model.norm.weight"] is other


@pytest.mark.parametrize("normalization", ["RMSNorm", "LayerNorm"])
def test_adapters_of_a_te_layernorm_linear_see_the_normalized_input(normalization):
    """Transformer Engine's LayerNorm-fused linears take the hidden states before the norm: the adapters
    apply the module's norm (TE's attributes: normalization, eps, layer_norm_weight/bias, zero-centered
    gamma) first; a plain linear's input passes as it is."""
    from megarl.models.lora.layers import _normed

    x = torch.randn(3, 2, 8)
    gamma, beta = torch.randn(8), torch.randn(8)
    te = SimpleNamespace(
        layer_norm_weight=gamma,
        layer_norm_bias=beta,
        eps=1e-5,
        normalization=normalization,
        zero_centered_gamma=True,
    )
    if normalization == "RMSNorm":
        expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * (gamma + 1)
    else:
        expected = torch.nn.functional.layer_norm(x, (8,), gamma + 1, beta, 1e-5)
    torch.testing.assert_close(_normed(te, x), expected)
    assert _normed(SimpleNamespace(), x) is x
