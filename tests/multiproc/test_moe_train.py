"""Training with expert parallelism on CPU: three AdamW steps of a tiny Qwen2-MoE give the same losses and
gradient norms at EP2 (with and without the distributed optimizer) and TP2 x EP2 as at EP1; the router's
aux and z losses (<role>.moe) change the router gradient and are logged as transformers' logits give
them. Its rank program runs in the 4-rank launch shared with other modules (tests/multiproc/conftest.py)."""

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
    runs = dict(shared_result(shared_launch, "moe_train"))
    runs.pop("router_losses")
    reference = runs.pop("ep1")
    assert reference["losses"][-1] < reference["losses"][0] - 0.5  # it learns the batch
    for name, run in runs.items():
        for ours, theirs in zip(run["losses"], reference["losses"]):
            assert abs(ours - theirs) <= 1e-5, (name, run, reference)
        for ours, theirs in zip(run["grad_norms"], reference["grad_norms"]):
            assert abs(ours - theirs) <= 1e-5 * theirs, (name, run, reference)


def test_router_losses_change_the_router_gradient_and_are_logged_as_computed_from_transformers(shared_launch):
    r = shared_result(shared_launch, "moe_train")["router_losses"]
    assert r["logged_without"] == {}  # load balancing "none", no z-loss: nothing tracked, nothing logged
    assert r["router_grad_change"] > 1e-3, r
    assert set(r["logged"]) == {"moe_aux_loss", "moe_z_loss"}
    for name, value in r["logged"].items():  # at EP2, DP4: one sequence per rank, averaged over ranks
        assert value == pytest.approx(r["reference"][name], rel=1e-5), (name, r)
