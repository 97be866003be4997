"""More ranks than this machine holds are refused at load for runs that start here, with megarl's keys
in the advice; multi-node runs and runs on a named Ray cluster are left to the placement of their pools."""

from __future__ import annotations

import pytest

from megarl.config import ConfigError, load_config
from megarl.config.machine import Machine, check_machine
from tests.helpers.hf_configs import TINY_LLAMA, write_model_config
from tests.unit.config.test_load import QUICKSTART, SIZES

pytestmark = pytest.mark.unit


@pytest.fixture
def run(tmp_path, monkeypatch) -> list[str]:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    model = write_model_config(tmp_path / "tiny_llama", TINY_LLAMA)
    (tmp_path / "train.parquet").touch()
    return [
        *SIZES,
        f"model.path={model}",
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        "data.val_files=[]",
        "trainer.eval_every=0",
    ]


def test_cpu_slots_are_two_per_core_and_at_least_sixteen():
    assert [Machine(gpus=0, cores=c).max_ranks for c in (1, 2, 8, 32)] == [16, 16, 16, 64]
    assert Machine(gpus=8, cores=2).max_ranks == 8


def _problems(overrides: list[str], machine: Machine) -> list[str]:
    cfg = load_config(None, check_paths=False)
    for item in overrides:
        key, value = item.removeprefix("trainer.").split("=")
        setattr(cfg.trainer, key, int(value) if value.isdigit() else value)
    problems: list[str] = []
    check_machine(cfg, problems, machine)
    return problems


def test_64_ranks_on_2_cpus_name_the_keys_to_change(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _problems(["trainer.n_devices_per_node=64"], Machine(gpus=0, cores=2)) == [
        "trainer.n_devices_per_node=64 asks for 64 ranks on this machine, which has no GPU and 2 CPU cores, so "
        "at most 16 CPU processes (2 per core, at least 16); set trainer.n_devices_per_node=16 or less (and the "
        "roles' n_devices and devices within it), or run on a cluster (trainer.nnodes > 1, or a Ray cluster "
        "named by RAY_ADDRESS)"
    ]
    assert _problems(["trainer.n_devices_per_node=16"], Machine(gpus=0, cores=2)) == []


def test_more_ranks_than_gpus_under_torchrun(monkeypatch):
    overrides = ["trainer.n_devices_per_node=8", "trainer.launcher=torchrun"]
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # torchrun starts every rank here all the same
    assert _problems(overrides, Machine(gpus=4, cores=64)) == [
        "trainer.n_devices_per_node=8 asks for 8 ranks on this machine, which has 4 GPUs; set "
        "trainer.n_devices_per_node=4 or less (and the roles' n_devices and devices within it), or run on a "
        "cluster (trainer.nnodes > 1, or a Ray cluster named by RAY_ADDRESS)"
    ]


def test_multi_node_and_named_ray_clusters_are_checked_later(monkeypatch):
    tiny = Machine(gpus=0, cores=2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _problems(["trainer.n_devices_per_node=64", "trainer.nnodes=2"], tiny) == []
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert _problems(["trainer.n_devices_per_node=64"], tiny) == []
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a private cluster on this machine
    assert len(_problems(["trainer.n_devices_per_node=64"], tiny)) == 1


def test_load_config_checks_this_machine_unless_paths_are_skipped(run):
    here = Machine.here()
    too_many = f"trainer.n_devices_per_node={here.max_ranks + 1}"
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, [*run, too_many])
    assert (
        f"{too_many} asks for {here.max_ranks + 1} ranks on this machine, which has {here.describe()}"
        in str(info.value)
    )
    with pytest.raises(ConfigError) as info:  # the batch sizes still do not split over that many ranks
        load_config(QUICKSTART, [*run, too_many], check_paths=False)
    assert "asks for" not in str(info.value)
