"""A critic starts from the policy's LM checkpoint: backbone loaded, fresh value head, [b, s, 1] out."""

import pytest

pytestmark = pytest.mark.multiproc


def test_critic_from_lm_checkpoint_loads_backbone_and_inits_head(tiny_models, torchrun):
    result = torchrun("tests.multiproc.critic_init_check", [tiny_models["llama"]], nproc=1).results[0]
    assert result["loaded"] == result["params"] - 1  # everything but the value head
    assert result["embedding_equal"]
    assert 0.005 < result["head_std"] < 0.1  # megatron's init_method (std 0.02), not zeros or garbage
    assert result["output_shape"] == [1, 12, 1]
