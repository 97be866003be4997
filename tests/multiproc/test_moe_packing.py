"""Variable-length packed micro-batches (THD) through megatron's MoE layer with the all-to-all token
dispatcher at EP2 on CPU: a packed micro-batch gives each sequence's logits as a forward of it alone
(megatron's default allgather dispatcher refuses variable lengths; the all-to-all one routes per token).
Its rank program runs in the 2-rank launch shared with other modules (tests/multiproc/conftest.py)."""

import pytest

from tests.conftest import PARITY_INIT
from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc


def _argv(request) -> list[str]:
    from megarl.models.tiny import build_tiny_hf

    root = request.getfixturevalue("tmp_path_factory").mktemp("moe_packing")
    return [str(build_tiny_hf(root / "qwen2_moe", family="qwen2_moe", num_hidden_layers=2, **PARITY_INIT))]


SHARED_PART_2 = ("moe_packing", "tests.multiproc.moe_packing_check", _argv)


def test_a_packed_micro_batch_routes_each_sequence_as_alone(shared_launch_2):
    result = shared_result(shared_launch_2, "moe_packing")
    assert result["logits_abs_max"] > 1.0
    assert result["max_abs_logit_diff"] <= 5e-5, result


def test_the_router_modules_have_the_exposed_names(shared_launch_2):
    """megarl.models.from_hf.ROUTER_MODULE: where router replay finds each MoE layer's router."""
    result = shared_result(shared_launch_2, "moe_packing")
    assert result["routers"] == result["router_names"] == [f"decoder.layers.{i}.mlp.router" for i in (0, 1)]
