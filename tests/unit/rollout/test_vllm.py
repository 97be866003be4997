"""Weight pushes into vLLM: which checkpoint tensors fill each engine layer, and refusing partial layers."""

from __future__ import annotations

import pytest

from megarl.rollout.vllm import check_complete_layers, checkpoint_names_by_layer

pytestmark = pytest.mark.unit

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
ATTN = "model.layers.0.self_attn"
# vLLM's parameter names for one Qwen2 layer (fused q/k/v with bias, fused gate/up) and the tied rest.
ENGINE_PARAMS = [
    "model.embed_tokens.weight",
    f"{ATTN}.qkv_proj.weight",
    f"{ATTN}.qkv_proj.bias",
    f"{ATTN}.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.norm.weight",
]


def layers() -> dict[str, set[str]]:
    return checkpoint_names_by_layer(ENGINE_PARAMS, PACKED)


def test_fused_engine_layers_map_to_their_checkpoint_tensors():
    by_layer = layers()
    assert by_layer[f"{ATTN}.qkv_proj"] == {f"{ATTN}.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")}
    assert by_layer["model.layers.0.mlp.gate_up_proj"] == {
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    }
    assert by_layer["model.norm"] == {"model.norm.weight"}
    assert len(by_layer) == len(ENGINE_PARAMS) - 1  # qkv weight and bias share a layer


def test_whole_layers_pass_in_any_subset():
    check_complete_layers([f"{ATTN}.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")], layers())
    check_complete_layers(["model.norm.weight", "model.layers.0.mlp.down_proj.weight"], layers())


def test_names_the_engine_does_not_have_are_left_to_the_engine():
    check_complete_layers(["lm_head.weight", "model.rotary_emb.inv_freq"], layers())


@pytest.mark.parametrize(
    "sent, missing",
    [
        ([f"{ATTN}.q_proj.weight"], [f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.bias"]),
        ([f"{ATTN}.{p}_proj.weight" for p in "qkv"], [f"{ATTN}.q_proj.bias", f"{ATTN}.k_proj.bias"]),
        (["model.layers.0.mlp.up_proj.weight"], ["model.layers.0.mlp.gate_proj.weight"]),
    ],
    ids=["q_alone", "weights_without_biases", "up_without_gate"],
)
def test_part_of_a_layer_is_refused_naming_what_is_missing(sent, missing):
    with pytest.raises(ValueError) as err:
        check_complete_layers(sent, layers())
    for name in missing:
        assert name in str(err.value)
