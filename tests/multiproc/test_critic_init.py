"""A critic starts from the policy's LM checkpoint: backbone loaded, fresh value head, [b, s, 1] out."""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

# in the 1-rank launch shared with other modules (tests/multiproc/conftest.py)
SHARED_PART_1 = (
    "critic_init",
    "tests.multiproc.critic_init_check",
    lambda request: [request.getfixturevalue("tiny_models")["llama"]],
)


def test_critic_from_lm_checkpoint_loads_backbone_and_inits_head(shared_launch_1):
    result = shared_result(shared_launch_1, "critic_init")
    assert result["loaded"] == result["params"] - 1  # everything but the value head
    assert result["embedding_equal"]
    assert 0.005 < result["head_std"] < 0.1  # megatron's init_method (std 0.02), not zeros or garbage
    assert result["output_shape"] == [1, 12, 1]
