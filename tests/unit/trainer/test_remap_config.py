"""What `trainer.remap` checks before it stops anything (megarl.trainer.remap; the move itself:
tests/e2e/test_remap.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megarl.config import load_config
from megarl.config.errors import ConfigError
from megarl.config.schema import ParallelConfig
from megarl.controller.device_map import DeviceMap
from megarl.trainer.remap import RemapError, remapped_config, scratch_dir

GRPO = Path(__file__).resolve().parents[3] / "configs" / "quickstart_grpo.yaml"


@pytest.fixture
def cfg(tiny_models, tmp_path):
    from megarl.data.tasks import make_task

    files = make_task("digits_reverse", tmp_path / "data", n_train=16, n_val=8, n_sft=8)
    return load_config(
        GRPO,
        [
            f"model.path={tiny_models['llama']}",
            f"data.train_files=[{files.train}]",
            f"data.val_files=[{files.val}]",
            f"trainer.output_dir={tmp_path / 'run'}",
            "actor.parallel.tp=2",
        ],
    )


def test_a_layout_that_cannot_work_is_refused_with_every_problem_and_the_config_kept(cfg):
    with pytest.raises(ConfigError) as e:
        remapped_config(cfg, "actor", {"tp": 3})
    assert "actor.parallel.tp=3 does not divide num_attention_heads=4 and num_key_value_heads=2" in str(
        e.value
    )
    assert "does not divide the 2 devices of the actor" in str(e.value)
    assert cfg.actor.parallel.tp == 2


def test_a_new_layout_or_new_devices_change_the_role_in_a_copy(cfg):
    new = remapped_config(cfg, "actor", ParallelConfig(tp=1))
    assert (new.actor.parallel.tp, new.layout("actor").dp, new.actor.devices) == (1, 2, None)
    moved = remapped_config(cfg, "actor", DeviceMap("megatron", ["cpu:0", "cpu:1"], tp=1))
    assert (moved.actor.devices, moved.layout("actor").dp) == (["cpu:0", "cpu:1"], 2)
    assert cfg.actor.parallel.tp == 2 and cfg.actor.devices is None


@pytest.mark.parametrize(
    ("role", "target", "edit", "expected"),
    [
        ("ref", {"tp": 1}, None, "remap('ref'): only the trained roles move at runtime (actor, critic); "),
        ("critic", {"tp": 1}, None, "remap('critic'): this run has no critic (critic.enable=false)"),
        ("actor", {"tensor_parallel": 1}, None, "tensor_parallel are no actor.parallel keys; use tp, "),
        ("actor", {"tp": 1}, "torchrun", "remap('actor') needs trainer.launcher=ray: under torchrun"),
    ],
)
def test_what_cannot_move_is_refused_with_what_to_do(cfg, role, target, edit, expected):
    if edit == "torchrun":
        cfg.trainer.launcher = "torchrun"
    with pytest.raises(RemapError) as e:
        remapped_config(cfg, role, target)
    assert expected in str(e.value)


def test_the_state_goes_to_shared_memory_only_when_it_fits_and_every_rank_is_here(tmp_path):
    where = scratch_dir(tmp_path, "run", need=1, one_node=True)
    assert where == (Path("/dev/shm/megarl-remap-run"), "memory") or not Path("/dev/shm").is_dir()
    assert scratch_dir(tmp_path, "run", need=1, one_node=False) == (tmp_path / "remap", "disk")
    assert scratch_dir(tmp_path, "run", need=1 << 60, one_node=True) == (tmp_path / "remap", "disk")
