"""HF <-> megatron name and layout maps for the Llama family."""

import pytest
import torch

from megarl.models.convert import llama
from megarl.models.from_hf import ModelArchitecture, UnsupportedModelError

pytestmark = pytest.mark.unit

BASE = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 1001,
}


def arch(**overrides):
    return ModelArchitecture.from_hf_config({**BASE, **overrides})


def test_fused_qkv_groups_each_kv_head_after_its_query_heads():
    a = arch()  # 4 query heads, 2 groups, head_dim 16
    q = torch.arange(4).repeat_interleave(16).float().unsqueeze(1)  # row value = query head index
    k = (10 + torch.arange(2)).repeat_interleave(16).float().unsqueeze(1)
    v = (20 + torch.arange(2)).repeat_interleave(16).float().unsqueeze(1)
    entry = llama.PARAMS["decoder.layers.{i}.self_attention.linear_qkv.weight"]
    fused = llama.merge(entry, [q, k, v], a)
    heads = fused[::16].flatten().tolist()
    assert heads == [0, 1, 10, 20, 2, 3, 11, 21]
    assert all(torch.equal(x, y) for x, y in zip(llama.split(entry, fused, a), [q, k, v]))


def test_qkv_bias_round_trips():
    a = arch(attention_bias=True)
    entry = llama.PARAMS["decoder.layers.{i}.self_attention.linear_qkv.bias"]
    parts = [torch.randn(64), torch.randn(32), torch.randn(32)]
    assert all(torch.equal(x, y) for x, y in zip(llama.split(entry, llama.merge(entry, parts, a), a), parts))


def test_names_follow_family_features():
    llama_names = llama.megatron_names(arch())
    qwen2_names = llama.megatron_names(arch(model_type="qwen2", tie_word_embeddings=True))
    qwen3_names = llama.megatron_names(arch(model_type="qwen3"))
    assert "output_layer.weight" in llama_names and "output_layer.weight" not in qwen2_names
    assert any(n.endswith("linear_qkv.bias") for n in qwen2_names)
    assert not any(n.endswith("linear_qkv.bias") for n in llama_names)
    assert any(n.endswith("q_layernorm.weight") for n in qwen3_names)
    assert len(llama_names) == 1 + 2 * 6 + 2


def test_tied_output_layer_maps_to_the_embedding():
    _, hf = llama.param_map("output_layer.weight", arch(tie_word_embeddings=True))
    assert hf == ["model.embed_tokens.weight"]


def test_te_fused_norm_names_map_like_local_ones():
    _, hf = llama.param_map("decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", arch())
    assert hf == ["model.layers.1.input_layernorm.weight"]


@pytest.mark.parametrize(
    "override, message",
    [
        ({"model_type": "gpt2"}, "model_type='gpt2' is not supported"),
        ({"hidden_act": "gelu"}, "only 'silu'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_unsupported_features_are_named(override, message):
    with pytest.raises(UnsupportedModelError, match=message):
        arch(**override)


def test_rope_settings_are_read_from_transformers5_rope_parameters():
    a = arch(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0})
    kwargs = a.gpt_model_kwargs(1024)
    assert kwargs["rotary_base"] == 500000 and kwargs["rope_scaling"] and kwargs["rope_scaling_factor"] == 8.0
    assert (
        arch(rope_parameters={"rope_type": "linear", "factor": 2.0}).gpt_model_kwargs(1024)[
            "seq_len_interpolation_factor"
        ]
        == 2.0
    )


def test_sequence_classification_checkpoints_get_a_scalar_head_named_score():
    a = arch(
        architectures=["LlamaForSequenceClassification"], id2label={0: "LABEL_0"}, tie_word_embeddings=True
    )
    assert a.head == "scalar"
    assert not a.gpt_model_kwargs(1024)["share_embeddings_and_output_weights"]
    entry, hf = llama.param_map("output_layer.weight", a)
    assert hf == ["score.weight"] and entry.kind == "replicated"
    assert "output_layer.weight" in llama.megatron_names(a)


def test_a_policy_checkpoint_can_become_a_critic():
    assert arch().with_scalar_head().head == "scalar"


def test_multi_label_classifiers_are_rejected():
    with pytest.raises(UnsupportedModelError, match="only 1"):
        arch(architectures=["LlamaForSequenceClassification"], id2label={0: "a", 1: "b"})
