"""Buckets close only between engine layers (megarl.hybrid.reshard.module_of): a module's weight and bias
together, and every routed expert of an MoE block together (vLLM fuses them into one layer, and
`VLLMRollout.load_weights` refuses part of one)."""

import pytest

from megarl.hybrid.reshard import module_of

pytestmark = pytest.mark.unit


def test_a_blocks_experts_are_one_module_and_other_parameters_their_own():
    x = "decoder.layers.1.mlp.experts.local_experts.{}.linear_fc{}.weight"
    assert {module_of(x.format(e, fc)) for e in range(4) for fc in (1, 2)} == {"decoder.layers.1.mlp.experts"}
    assert module_of(x.format(0, 1)) != module_of(x.format(0, 1).replace("layers.1", "layers.2"))
    qkv = "decoder.layers.0.self_attention.linear_qkv"
    assert module_of(f"{qkv}.weight") == module_of(f"{qkv}.bias") == qkv
    assert module_of("decoder.layers.0.mlp.router.weight") == "decoder.layers.0.mlp.router"
