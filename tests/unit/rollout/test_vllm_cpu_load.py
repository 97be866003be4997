"""The direct CPU weight push's plan: what goes where, and when it leaves the push to vLLM's loader.

The engine here is a stand-in with the shapes vLLM's CPU layers have after loading (a packed linear
layer keeps an empty `weight` and a `cpu_linear`); the real engine is exercised by
tests/multiproc/test_vllm_rollout.py.
"""

from __future__ import annotations

import torch

from megarl.rollout.vllm_cpu_load import _plan

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


class Linear(torch.nn.Module):
    """A CPU linear layer after vLLM's processing: its weight packed away, the bias kept."""

    def __init__(self, out: int, inp: int, bias: bool = False) -> None:
        super().__init__()
        self.output_size_per_partition, self.input_size_per_partition = out, inp
        self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(out), requires_grad=False) if bias else None
        self.cpu_linear = torch.nn.functional.linear


def engine() -> torch.nn.Module:
    attn = torch.nn.Module()
    attn.qkv_proj, attn.o_proj = Linear(8 + 4 + 4, 8, bias=True), Linear(8, 8)
    layer = torch.nn.Module()
    layer.self_attn, layer.input_layernorm = attn, torch.nn.Module()
    layer.input_layernorm.weight = torch.nn.Parameter(torch.ones(8), requires_grad=False)
    model = torch.nn.Module()
    model.embed_tokens = torch.nn.Module()
    model.embed_tokens.weight = torch.nn.Parameter(torch.zeros(16, 8), requires_grad=False)  # vocab 13
    model.layers = torch.nn.ModuleList([layer])
    root = torch.nn.Module()
    root.model = model
    return root


def hf_layer() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {
        "q_proj.weight": (8, 8),
        "k_proj.weight": (4, 8),
        "v_proj.weight": (4, 8),
        "q_proj.bias": (8,),
        "k_proj.bias": (4,),
        "v_proj.bias": (4,),
        "o_proj.weight": (8, 8),
    }
    return {f"model.layers.0.self_attn.{k}": torch.randn(s, generator=g) for k, s in shapes.items()}


def test_fused_layers_get_the_concatenation_and_plain_ones_a_copy_never_the_callers_tensor():
    weights = hf_layer()
    weights["model.layers.0.input_layernorm.weight"] = torch.full((8,), 2.0)
    weights["model.embed_tokens.weight"] = torch.randn(13, 8)
    plan = {
        (type(m).__name__, name, tuple(t.shape)): t
        for m, name, t in _plan(engine(), PACKED, list(weights.items()))
    }
    prefix = "model.layers.0.self_attn."
    qkv = plan[("Linear", "weight", (16, 8))]
    assert torch.equal(qkv, torch.cat([weights[prefix + f"{p}_proj.weight"] for p in "qkv"]))
    bias = plan[("Linear", "bias", (16,))]
    assert torch.equal(bias, torch.cat([weights[prefix + f"{p}_proj.bias"] for p in "qkv"]))
    o_proj = plan[("Linear", "weight", (8, 8))]
    assert torch.equal(o_proj, weights[prefix + "o_proj.weight"])
    assert o_proj.data_ptr() != weights[prefix + "o_proj.weight"].data_ptr()  # the GEMM handle's own copy
    assert ("Module", "weight", (13, 8)) in plan  # the padded embedding: its loader pads
    assert len(plan) == 5


def test_anything_without_a_plain_destination_leaves_the_push_to_vllm():
    model = engine()
    weights = hf_layer()
    unknown = {**weights, "model.layers.0.mlp.down_proj.weight": torch.randn(8, 8)}
    assert _plan(model, PACKED, list(unknown.items())) is None  # no such engine module
    wrong_shape = {**weights, "model.layers.0.self_attn.o_proj.weight": torch.randn(8, 4)}
    assert _plan(model, PACKED, list(wrong_shape.items())) is None
    wrong_dtype = {**weights, "model.layers.0.self_attn.o_proj.weight": torch.randn(8, 8).double()}
    assert _plan(model, PACKED, list(wrong_dtype.items())) is None
    k_missing = {k: v for k, v in weights.items() if "k_proj.weight" not in k}
    assert _plan(model, PACKED, list(k_missing.items())) is None
    too_many_rows = {"model.embed_tokens.weight": torch.randn(20, 8)}
    assert _plan(model, PACKED, list(too_many_rows.items())) is None
