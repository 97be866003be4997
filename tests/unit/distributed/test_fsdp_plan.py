"""FSDPGenerationPlan against an independent count: the engine region and the FSDP rows as explicit
element-index sets (torch.chunk over the world; vLLM's own vocabulary shard indices), |needed − held|."""

from __future__ import annotations

import pytest
import torch

from megarl.distributed.fsdp_plan import (
    VOCAB_PADDING,
    FSDPGenerationPlan,
    check_fsdp_rollout_tp,
    pad_vocab,
)
from megarl.distributed.layout import LayoutError

# heads 4, kv heads 2, head_dim 3, hidden 12, ffn 20, vocab 101: every dim 0 uneven over 3 FSDP ranks
HEADS, KV, HEAD_DIM, HIDDEN, FFN, VOCAB = 4, 2, 3, 12, 20, 101
PARAMS = {
    "model.embed_tokens.weight": (VOCAB, HIDDEN),
    "model.layers.0.input_layernorm.weight": (HIDDEN,),
    "model.layers.0.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
    "model.layers.0.self_attn.q_proj.bias": (HEADS * HEAD_DIM,),
    "model.layers.0.self_attn.k_proj.weight": (KV * HEAD_DIM, HIDDEN),
    "model.layers.0.self_attn.k_proj.bias": (KV * HEAD_DIM,),
    "model.layers.0.self_attn.v_proj.weight": (KV * HEAD_DIM, HIDDEN),
    "model.layers.0.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
    "model.layers.0.self_attn.o_proj.bias": (HIDDEN,),
    "model.layers.0.self_attn.q_norm.weight": (HEAD_DIM,),
    "model.layers.0.mlp.gate_proj.weight": (FFN, HIDDEN),
    "model.layers.0.mlp.up_proj.weight": (FFN, HIDDEN),
    "model.layers.0.mlp.down_proj.weight": (HIDDEN, FFN),
    "model.norm.weight": (HIDDEN,),
    "lm_head.weight": (VOCAB, HIDDEN),
}
CONFIG = {
    "model_type": "qwen3",
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV,
    "vocab_size": VOCAB,
}


def engine_indices(name: str, shape: tuple[int, ...], g: int, t: int) -> set[int]:
    """Element indices of the full tensor that engine TP rank g of t loads, written from vLLM's layers."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    idx = torch.arange(torch.Size(shape).numel()).reshape(shape)
    leaf = name.split(".")[-2]
    if t == 1 or "norm" in leaf or (leaf in ("o_proj", "down_proj") and name.endswith("bias")):
        part = idx
    elif leaf in ("embed_tokens", "lm_head"):
        padded = pad_vocab(shape[0])
        s = VocabParallelEmbedding._get_indices(padded, padded, shape[0], shape[0], g, t)
        part = idx[s.org_vocab_start_index : s.org_vocab_end_index]
    elif leaf in ("k_proj", "v_proj") and t >= KV:
        part = idx.reshape(KV, -1, *shape[1:])[g // (t // KV)]  # QKVParallelLinear: kv head replicas
    elif leaf in ("o_proj", "down_proj"):
        part = idx.chunk(t, dim=1)[g]
    else:
        part = idx.chunk(t, dim=0)[g]
    return set(part.flatten().tolist())


def fsdp_indices(shape: tuple[int, ...], rank: int, world: int) -> set[int]:
    chunks = torch.arange(torch.Size(shape).numel()).reshape(shape).chunk(world, dim=0)
    return set(chunks[rank].flatten().tolist()) if rank < len(chunks) else set()


@pytest.mark.parametrize("world,gen_tp", [(1, 1), (2, 1), (3, 1), (2, 2), (4, 2), (4, 4), (8, 4), (6, 2)])
def test_received_bytes_equal_an_explicit_index_count(world, gen_tp):
    plan = FSDPGenerationPlan.for_hf_config(CONFIG, world, gen_tp)
    for rank in range(world):
        for name, shape in PARAMS.items():
            needed = engine_indices(name, shape, rank % gen_tp, gen_tp)
            missing = needed - fsdp_indices(shape, rank, world)
            assert plan.received_bytes(name, shape, torch.bfloat16, rank) == 2 * len(missing), (name, rank)
            region = plan.engine_region(name, shape, rank)
            assert region.numel(shape) == len(needed), (name, rank)


def test_pieces_from_every_source_tile_the_region_once():
    world, gen_tp = 6, 2
    plan = FSDPGenerationPlan.for_hf_config(CONFIG, world, gen_tp)
    for name, shape in PARAMS.items():
        for dest in range(world):
            sizes = [plan.piece(name, shape, s, dest) for s in range(world)]
            total = sum(p.numel(shape) for p in sizes if p is not None)
            assert total == plan.engine_region(name, shape, dest).numel(shape), name


def test_at_rollout_tp1_every_rank_needs_everything_any_architecture():
    plan = FSDPGenerationPlan(world_size=3, gen_tp=1, model_type="gpt_neox")
    shape = (10, 4)  # rows 4, 4, 2
    assert [plan.received_bytes("gpt_neox.anything.weight", shape, torch.float32, r) for r in range(3)] == [
        6 * 4 * 4,
        6 * 4 * 4,
        8 * 4 * 4,
    ]
    assert plan.received_bytes("x.weight", shape, torch.float32, 0, sharded=False) == 0


def test_kv_heads_are_replicated_when_rollout_tp_exceeds_them():
    plan = FSDPGenerationPlan(world_size=4, gen_tp=4, model_type="llama", num_heads=4, num_kv_heads=2)
    shape = (2 * HEAD_DIM, HIDDEN)
    regions = [plan.engine_region("model.layers.0.self_attn.k_proj.weight", shape, r).rows for r in range(4)]
    assert regions == [(0, 3), (0, 3), (3, 6), (3, 6)]


def test_vocab_rows_follow_vllm_padding():
    assert VOCAB_PADDING == 64 and pad_vocab(101) == 128
    plan = FSDPGenerationPlan.for_hf_config(CONFIG, 4, 4)
    rows = [plan.engine_region("lm_head.weight", (VOCAB, HIDDEN), r).rows for r in range(4)]
    assert rows == [(0, 32), (32, 64), (64, 96), (96, 101)]


def test_generation_groups_are_consecutive_runs():
    plan = FSDPGenerationPlan(world_size=4, gen_tp=2, model_type="llama", num_heads=4, num_kv_heads=2)
    assert plan.gen_tp_groups == [[0, 1], [2, 3]]
    assert [plan.gen_tp_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert [plan.gen_dp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert plan.gen_dp_size == 2 and plan.gen_tp_group(3) == [2, 3]


def test_rollout_tp_must_divide_the_world():
    with pytest.raises(LayoutError, match=r"rollout.tp=3 does not divide the FSDP actor's world of 4 ranks"):
        FSDPGenerationPlan(world_size=4, gen_tp=3)


def test_unknown_architecture_at_rollout_tp2_names_the_fix():
    config = {"model_type": "gpt_neox", "num_attention_heads": 4}
    with pytest.raises(LayoutError) as e:
        check_fsdp_rollout_tp(config, gen_tp=2, world_size=2)
    assert "rollout.tp=2 > 1 with an FSDP actor needs the engine's sharding of gpt_neox" in str(e.value)
    assert "megarl knows it for gemma2, gemma3_text, llama, mistral, qwen2, qwen3; use rollout.tp=1" in str(
        e.value
    )
    check_fsdp_rollout_tp(config, gen_tp=1, world_size=2)  # any architecture at rollout.tp=1


def test_heads_that_do_not_split_are_reported():
    config = {**CONFIG, "num_attention_heads": 6, "num_key_value_heads": 3}
    with pytest.raises(LayoutError) as e:
        check_fsdp_rollout_tp(config, gen_tp=4, world_size=4)
    assert "rollout.tp=4 does not divide num_attention_heads=6" in str(e.value)
    assert "rollout.tp=4 and num_key_value_heads=3: vLLM needs one to divide the other" in str(e.value)
