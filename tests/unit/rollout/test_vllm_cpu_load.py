"""The direct CPU weight push: what goes where, that the layers then compute with the new weights, and
when it leaves the push to vLLM's `reload_weights` having changed nothing.

The engine here is a stand-in module tree with vLLM's own CPU layer methods (the oneDNN GEMM packing
that `process_weights_after_loading` does); the real engine is exercised by
tests/multiproc/test_vllm_rollout.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megarl.rollout.vllm_cpu_load import _plan, load_into_layers

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
VOCAB, PADDED, HIDDEN = 13, 16, 8


def linear(out: int, inp: int, bias: bool = False) -> torch.nn.Module:
    """A CPU linear layer after vLLM's loading: its weight packed away into a GEMM handle."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    layer = torch.nn.Module()
    layer.output_size_per_partition, layer.input_size_per_partition = out, inp
    layer.weight = torch.nn.Parameter(torch.randn(out, inp), requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.randn(out), requires_grad=False) if bias else None
    layer.quant_method = UnquantizedLinearMethod()
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def engine() -> torch.nn.Module:
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    attn = torch.nn.Module()
    attn.qkv_proj, attn.o_proj = linear(HIDDEN + 8, HIDDEN, bias=True), linear(HIDDEN, HIDDEN)
    layer = torch.nn.Module()
    layer.self_attn, layer.input_layernorm = attn, torch.nn.Module()
    layer.input_layernorm.weight = torch.nn.Parameter(torch.ones(HIDDEN), requires_grad=False)
    embed = torch.nn.Module()
    embed.weight = torch.nn.Parameter(torch.randn(PADDED, HIDDEN), requires_grad=False)
    embed.org_vocab_size, embed.num_added_embeddings = VOCAB, 0
    embed.quant_method = UnquantizedEmbeddingMethod()
    model = torch.nn.Module()
    model.embed_tokens, model.layers = embed, torch.nn.ModuleList([layer])
    root = torch.nn.Module()
    root.model, root.packed_modules_mapping = model, PACKED
    return root


def worker(model: torch.nn.Module, model_type: str = "llama", quantization=None):
    config = SimpleNamespace(quantization=quantization, hf_config=SimpleNamespace(model_type=model_type))
    return SimpleNamespace(model_runner=SimpleNamespace(model=model, model_config=config))


def checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        "self_attn.k_proj.weight": (4, HIDDEN),
        "self_attn.v_proj.weight": (4, HIDDEN),
        "self_attn.q_proj.bias": (HIDDEN,),
        "self_attn.k_proj.bias": (4,),
        "self_attn.v_proj.bias": (4,),
        "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        "input_layernorm.weight": (HIDDEN,),
    }
    out = {f"model.layers.0.{k}": torch.randn(s, generator=g) for k, s in shapes.items()}
    out["model.embed_tokens.weight"] = torch.randn(VOCAB, HIDDEN, generator=g)
    return out


def test_the_layers_compute_with_the_pushed_weights():
    model, weights = engine(), checkpoint()
    assert load_into_layers(worker(model), list(weights.items()))
    x = torch.randn(5, HIDDEN)
    attn, w = model.model.layers[0].self_attn, {k.split(".", 3)[-1]: v for k, v in weights.items()}
    qkv = torch.cat([w[f"self_attn.{p}_proj.weight"] for p in "qkv"])
    bias = torch.cat([w[f"self_attn.{p}_proj.bias"] for p in "qkv"])
    got = attn.qkv_proj.cpu_linear(x, attn.qkv_proj.weight, attn.qkv_proj.bias)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, qkv, bias), rtol=1e-5, atol=1e-5)
    o_proj = attn.o_proj.cpu_linear(x, attn.o_proj.weight, None)
    torch.testing.assert_close(o_proj, x @ w["self_attn.o_proj.weight"].T, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.model.layers[0].input_layernorm.weight, w["input_layernorm.weight"])
    embed = model.model.embed_tokens.weight
    assert torch.equal(embed[:VOCAB], weights["model.embed_tokens.weight"])
    assert not embed[VOCAB:].any()  # the padding rows zero, as vLLM's loader leaves them


def test_the_packed_linear_weights_are_the_engines_own_copies():
    plan = _plan(engine(), PACKED, list(checkpoint().items()))
    given = {t.data_ptr() for t in checkpoint().values()}
    assert all(t.data_ptr() not in given and t.is_contiguous() for _, _, t in plan)


@pytest.mark.parametrize(
    "change",
    [
        {"model.layers.0.mlp.down_proj.weight": torch.randn(HIDDEN, HIDDEN)},  # no such engine module
        {"model.layers.0.self_attn.o_proj.weight": torch.randn(HIDDEN, 4)},  # wrong shape
        {"model.embed_tokens.weight": torch.randn(VOCAB + 1, HIDDEN)},  # not the engine's vocabulary
        {"model.layers.0.self_attn.k_proj.weight": None},  # part of qkv_proj missing
    ],
)
def test_a_push_it_cannot_place_changes_nothing(change):
    model, weights = engine(), {**checkpoint(), **change}
    weights = {k: v for k, v in weights.items() if v is not None}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    handles = {n: m.cpu_linear for n, m in model.named_modules() if hasattr(m, "cpu_linear")}
    assert not load_into_layers(worker(model), list(weights.items()))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(m.cpu_linear is handles[n] for n, m in model.named_modules() if hasattr(m, "cpu_linear"))


@pytest.mark.parametrize("model_type, quantization", [("gpt2", None), ("llama", "fp8")])
def test_other_models_and_quantized_engines_go_to_vllms_loader(model_type, quantization):
    model = engine()
    assert not load_into_layers(worker(model, model_type, quantization), list(checkpoint().items()))
