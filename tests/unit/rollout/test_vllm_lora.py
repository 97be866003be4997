"""The engine side of adapter-only sync, without an engine: which region of each PEFT tensor an engine TP
rank reads (against vLLM's own LoRA layers' slicing), the engine's LoRA arguments and the checksum.
The real engine: tests/multiproc/test_vllm_lora.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megarl.rollout.vllm_lora import checksum, engine_lora_kwargs, engine_region, engine_target_modules

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN, R = 8, 2, 4, 32, 48, 8
LAYER = "base_model.model.model.layers.3"


def _base_layer(tp: int, tp_rank: int, output_sizes: list[int], input_size: int) -> SimpleNamespace:
    """What vLLM's LoRA wrappers read of the layer they wrap, as vLLM's parallel linears compute it."""
    kv_local = max(1, KV_HEADS // tp)
    return SimpleNamespace(
        tp_size=tp,
        tp_rank=tp_rank,
        input_size=input_size,
        input_size_per_partition=input_size // tp,
        output_size=sum(output_sizes),
        output_size_per_partition=sum(output_sizes) // tp,
        output_sizes=output_sizes,
        num_heads=HEADS // tp,
        head_size=HEAD_DIM,
        num_kv_heads=kv_local,
        total_num_heads=HEADS,
        total_num_kv_heads=KV_HEADS,
        num_kv_head_replicas=max(1, tp // KV_HEADS),
        weight=torch.empty(0),
    )


def _vllm_reads(tp: int, tp_rank: int) -> dict[str, torch.Tensor]:
    """What vLLM's LoRA layers keep of each full tensor (`_full`) on rank `tp_rank` of `tp`."""
    from vllm.lora.layers import (
        MergedColumnParallelLinearWithLoRA,
        MergedQKVParallelLinearWithLoRA,
        RowParallelLinearWithLoRA,
    )

    full = _full()
    kv = KV_HEADS * HEAD_DIM
    qkv = MergedQKVParallelLinearWithLoRA(_base_layer(tp, tp_rank, [HEADS * HEAD_DIM, kv, kv], HIDDEN))
    gate_up = MergedColumnParallelLinearWithLoRA(_base_layer(tp, tp_rank, [FFN, FFN], HIDDEN))
    rows = {
        "o_proj": RowParallelLinearWithLoRA(_base_layer(tp, tp_rank, [HIDDEN], HEADS * HEAD_DIM)),
        "down_proj": RowParallelLinearWithLoRA(_base_layer(tp, tp_rank, [HIDDEN], FFN)),
    }
    reads = {}
    for layer, projections in ((qkv, ("q_proj", "k_proj", "v_proj")), (gate_up, ("gate_proj", "up_proj"))):
        a = layer.slice_lora_a([full[_name(p, "A")] for p in projections])
        b = layer.slice_lora_b([full[_name(p, "B")] for p in projections])
        for p, a_i, b_i in zip(projections, a, b):
            reads[_name(p, "A")], reads[_name(p, "B")] = a_i, b_i
    for p, layer in rows.items():
        reads[_name(p, "A")] = layer.slice_lora_a(full[_name(p, "A")])
        reads[_name(p, "B")] = layer.slice_lora_b(full[_name(p, "B")])
    return reads


def _name(projection: str, part: str) -> str:
    module = "mlp" if projection in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"{LAYER}.{module}.{projection}.lora_{part}.weight"


def _full() -> dict[str, torch.Tensor]:
    shapes = {  # (out, in) of each projection
        "q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "gate_proj": (FFN, HIDDEN),
        "up_proj": (FFN, HIDDEN),
        "down_proj": (HIDDEN, FFN),
    }
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for p, (out, inp) in shapes.items():
        tensors[_name(p, "A")] = torch.randn(R, inp, generator=g)
        tensors[_name(p, "B")] = torch.randn(out, R, generator=g)
    return tensors


@pytest.mark.parametrize("tp", [1, 2, 4, 8])  # 4, 8: more ranks than KV heads, each KV head on several
def test_engine_region_is_what_vllm_layers_slice(tp):
    full = _full()
    for tp_rank in range(tp):
        reads = _vllm_reads(tp, tp_rank) if tp > 1 else full  # vLLM slices nothing at TP 1
        for name, tensor in full.items():
            region = tensor[engine_region(name, tuple(tensor.shape), tp, tp_rank, KV_HEADS)]
            assert torch.equal(region, reads[name]), (tp, tp_rank, name)


def test_engine_region_refuses_a_name_that_is_not_a_lora_tensor():
    with pytest.raises(ValueError, match="not a PEFT LoRA tensor name"):
        engine_region("model.layers.0.self_attn.q_proj.weight", (4, 4), 1, 0, 1)


@pytest.mark.parametrize(("rank", "served"), [(1, 1), (4, 8), (8, 8), (12, 16), (100, 128), (300, 320)])
def test_engine_serves_the_smallest_allowed_rank_that_holds_the_adapter(rank, served):
    kwargs = engine_lora_kwargs(SimpleNamespace(rank=rank, target_modules=["all-linear"]))
    assert kwargs["max_lora_rank"] == served
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_cpu_loras"]) == (True, 1, 1)


def test_rank_above_what_vllm_serves_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"rank=1024 .*512.*sync=merged"):
        engine_lora_kwargs(SimpleNamespace(rank=1024, target_modules=["all-linear"]))


@pytest.mark.parametrize(
    ("targets", "excluded", "wrapped"),
    [
        (["all-linear"], [], None),
        ("all-linear", [], None),
        (["*.layers.0.*"], [], None),
        (["q_proj", "v_proj"], [], ["q_proj", "v_proj"]),
        (["linear_qkv", "linear_fc2"], ["k_proj"], ["down_proj", "q_proj", "v_proj"]),
        (["linear_fc1"], [], ["gate_proj", "up_proj"]),
    ],
)
def test_engine_wraps_the_targeted_projections(targets, excluded, wrapped):
    assert engine_target_modules(targets, excluded) == wrapped


def test_checksum_sees_a_transpose_and_a_swap():
    t = torch.arange(12.0).reshape(3, 4)
    assert checksum(t) == checksum(t.clone())
    assert checksum(t) != checksum(t.T.reshape(3, 4))
    assert checksum(t) != checksum(t[[1, 0, 2]])
