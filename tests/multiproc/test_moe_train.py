"""Training with expert parallelism on CPU: three AdamW steps of a tiny Qwen2-MoE give the same losses and
gradient norms at EP2 (with and without the distributed optimizer) and TP2 x EP2 as at EP1. Its rank
program runs in the 4-rank launch shared with other modules (tests/multiproc/conftest.py)."""

import pytest

from tests.conftest import PARITY_INIT
from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc


def _argv(request) -> list[str]:
    from megarl.models.tiny import build_tiny_hf

    root = request.getfixturevalue("tmp_path_factory").mktemp("moe_train")
    return [str(build_tiny_hf(root / "qwen2_moe", family="qwen2_moe", num_hidden_layers=2, **PARITY_INIT))]


SHARED_PART = ("moe_train", "tests.multiproc.moe_train_check", _argv)


def test_expert_parallel_training_follows_the_ep1_run(shared_launch):
    runs = shared_result(shared_launch, "moe_train")
    reference = runs.pop("ep1")
    assert reference["losses"][-1] < reference["losses"][0] - 0.5  # it learns the batch
    for name, run in runs.items():
        for ours, theirs in zip(run["losses"], reference["losses"]):
            assert abs(ours - theirs) <= 1e-5, (name, run, reference)
        for ours, theirs in zip(run["grad_norms"], reference["grad_norms"]):
            assert abs(ours - theirs) <= 1e-5 * theirs, (name, run, reference)
