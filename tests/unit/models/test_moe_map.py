"""The mixture-of-experts families: HF config -> megatron MoE settings, refusals, and the per-expert
HF <-> megatron name and layout maps (the numerics: tests/multiproc/test_parity.py, "moe")."""

import pytest
import torch

from megarl.distributed.layout import ParallelLayout
from megarl.distributed.param_kind import ParamKind
from megarl.models.convert import llama
from megarl.models.from_hf import ModelArchitecture, UnsupportedModelError

pytestmark = pytest.mark.unit

QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "vocab_size": 1001,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "router_aux_loss_coef": 0.001,
}
QWEN2_MOE = {**QWEN3_MOE, "model_type": "qwen2_moe", "norm_topk_prob": False}
QWEN2_MOE["shared_expert_intermediate_size"] = 48


def arch(base=QWEN3_MOE, **overrides):
    return ModelArchitecture.from_hf_config({**base, **overrides})


def test_dense_models_have_no_experts():
    dense = arch(model_type="qwen3")
    assert dense.moe is None and dense.num_experts == dense.moe_topk == 0


def test_qwen3_moe_becomes_megatrons_top_k_router_with_the_all_to_all_dispatcher():
    a = arch()
    assert (a.num_experts, a.moe_topk, a.qk_norm, a.qkv_bias) == (4, 2, True, False)
    config = a.moe.transformer_config_fields()
    assert config["num_moe_experts"] == 4 and config["moe_router_topk"] == 2
    assert config["moe_ffn_hidden_size"] == 32
    # renormalised top-k = softmax over the top-k logits: megatron's order without pre-softmax
    assert config["moe_router_pre_softmax"] is False
    assert config["moe_token_dispatcher_type"] == "alltoall"
    assert config["moe_shared_expert_intermediate_size"] is None and not config["moe_shared_expert_gate"]


def test_qwen2_moe_has_a_gated_shared_expert_and_qkv_bias():
    a = arch(QWEN2_MOE)
    config = a.moe.transformer_config_fields()
    assert a.qkv_bias and not a.qk_norm
    assert config["moe_router_pre_softmax"] is True  # HF: softmax over all experts, then top-k
    assert config["moe_shared_expert_intermediate_size"] == 48 and config["moe_shared_expert_gate"]


def test_transformers5_num_local_experts_is_read():
    hf = {k: v for k, v in QWEN3_MOE.items() if k != "num_experts"}
    assert ModelArchitecture.from_hf_config({**hf, "num_local_experts": 8}).num_experts == 8


def test_router_aux_loss_counts_as_in_hf_training_and_z_loss_is_read():
    off = arch().moe.transformer_config_fields()
    assert off["moe_aux_loss_coeff"] == 0.0 and off["moe_router_load_balancing_type"] == "none"
    on = arch(output_router_logits=True, router_z_loss_coef=0.01).moe.transformer_config_fields()
    assert on["moe_aux_loss_coeff"] == 0.001 and on["moe_router_load_balancing_type"] == "aux_loss"
    assert on["moe_z_loss_coeff"] == 0.01


def test_transformer_config_carries_the_moe_fields_and_the_expert_parallel_size():
    config = arch().transformer_config(ParallelLayout(world_size=2, ep=2))
    assert config.num_moe_experts == 4 and config.expert_model_parallel_size == 2
    assert config.moe_router_dtype == "fp32" and not config.moe_grouped_gemm


@pytest.mark.parametrize(
    "base, override, message",
    [
        (QWEN3_MOE, {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
        (QWEN3_MOE, {"mlp_only_layers": [0]}, r"mlp_only_layers=\[0\]"),
        (QWEN2_MOE, {"shared_expert_intermediate_size": 0}, "needs a shared expert"),
    ],
)
def test_unsupported_moe_settings_are_named(base, override, message):
    with pytest.raises(UnsupportedModelError, match=message):
        arch(base, **override)


def test_names_list_the_router_and_every_expert_instead_of_the_dense_mlp():
    names = llama.megatron_names(arch())
    assert not any(".mlp.linear_fc" in n for n in names)
    assert "decoder.layers.1.mlp.router.weight" in names
    experts = [n for n in names if ".local_experts." in n]
    assert len(experts) == 2 * 4 * 2  # layers x experts x (fc1, fc2)
    shared = [n for n in llama.megatron_names(arch(QWEN2_MOE)) if ".shared_experts." in n]
    assert len(shared) == 2 * 3  # fc1, fc2, gate_weight per layer


def test_expert_params_map_to_the_hf_experts_by_global_index():
    entry, hf = llama.param_map("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight", arch())
    assert entry.expert and entry.kind is ParamKind.GATE_UP and entry.combine == "gate_up"
    assert hf == [
        "model.layers.1.mlp.experts.3.gate_proj.weight",
        "model.layers.1.mlp.experts.3.up_proj.weight",
    ]
    entry, hf = llama.param_map("decoder.layers.0.mlp.router.weight", arch())
    assert (
        not entry.expert and entry.kind is ParamKind.REPLICATED and hf == ["model.layers.0.mlp.gate.weight"]
    )
    entry, hf = llama.param_map("decoder.layers.0.mlp.shared_experts.gate_weight", arch(QWEN2_MOE))
    assert hf == ["model.layers.0.mlp.shared_expert_gate.weight"]
    with pytest.raises(KeyError, match="qwen3_moe"):
        llama.param_map("decoder.layers.0.mlp.shared_experts.gate_weight", arch())


def test_transformers5_fused_experts_split_into_the_checkpoints_per_expert_tensors():
    gate_up = torch.arange(4 * 6 * 3.0).reshape(4, 6, 3)  # [experts, 2 * intermediate, hidden]
    down = torch.arange(4 * 3 * 3.0).reshape(4, 3, 3)
    named = {"model.layers.0.mlp.experts.gate_up_proj": gate_up, "model.layers.0.mlp.experts.down_proj": down}
    out = llama.checkpoint_tensors({**named, "model.norm.weight": torch.ones(3)})
    assert torch.equal(out["model.layers.0.mlp.experts.2.gate_proj.weight"], gate_up[2, :3])
    assert torch.equal(out["model.layers.0.mlp.experts.2.up_proj.weight"], gate_up[2, 3:])
    assert torch.equal(out["model.layers.0.mlp.experts.1.down_proj.weight"], down[1])
    assert len(out) == 4 * 3 + 1


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_config_checks_count_the_experts_the_model_is_built_with(tmp_path, family):
    """megarl.config.parallel_checks reads the expert count from config.json without torch (the ep
    rules); it must be the count the megatron model is built with."""
    from megarl.config.parallel_checks import read_model_dims
    from megarl.models.tiny import tiny_config

    tiny_config(family).save_pretrained(tmp_path)  # transformers 5 writes num_local_experts
    assert (
        read_model_dims(str(tmp_path)).num_experts
        == ModelArchitecture.from_pretrained(tmp_path).num_experts
        == 4
    )
