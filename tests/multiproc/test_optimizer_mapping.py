"""OptimizerConfig.name and torch optimizers mapped onto megatron's optimizer, numerically: a torch AdamW
instance gives the same step-1 update as the equivalent dict, and megatron's "adamw", "adam" (L2) and
"sgd" give the updates torch.optim's AdamW, Adam and SGD give; SGD resumes from a checkpoint — a part of
the 1-rank launch shared with other modules (tests/multiproc/conftest.py)."""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

SHARED_PART_1 = (
    "optimizer_mapping",
    "tests.multiproc.optimizer_mapping_checks",
    lambda request: [request.getfixturevalue("tmp_path_factory").mktemp("optimizer_mapping")],
)


@pytest.fixture(scope="module")
def result(shared_launch_1):
    return shared_result(shared_launch_1, "optimizer_mapping")


@pytest.mark.parametrize("dist_opt", ["False", "True"])
def test_a_torch_adamw_instance_gives_the_step1_update_of_the_equivalent_dict(result, dist_opt):
    assert result["step1_max_change"] > 1e-3, "the step barely moved the parameters"
    assert result["adamw_instance_vs_dict_max_diff"][dist_opt] == 0.0


@pytest.mark.parametrize(
    "run",
    [
        "adamw/dist_opt=False",
        "adamw/dist_opt=True",
        "adam/dist_opt=False",
        "adam/dist_opt=True",
        "sgd/dist_opt=False",
    ],
)
def test_each_name_steps_like_its_torch_optimizer(result, run):
    assert result["vs_torch_allclose_ratio"][run] <= 1  # allclose(rtol=1e-6, atol=1e-7)


def test_adam_and_sgd_are_not_adamw_in_disguise(result):
    assert min(result["adam_and_sgd_vs_adamw_allclose_ratio"].values()) > 1e3


def test_sgd_with_the_distributed_optimizer_is_refused_before_megatron_asserts(result):
    assert "name='sgd' needs use_distributed_optimizer=False" in result["sgd_dist_opt_error"]


def test_sgd_momentum_survives_a_checkpoint(result):
    assert result["sgd_resume_max_diff"] == 0.0
