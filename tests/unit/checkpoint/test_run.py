"""A run's checkpoint directories: atomic publish, `latest`, keep-last-K, and what trainer.resume finds.

The role checkpoints inside a step directory are the workers' (tests/multiproc, tests/e2e); here the
run-level bookkeeping is checked with the trainer's own state only."""

import json

import pytest

from megarl.checkpoint.run import (
    ResumeError,
    RunCheckpoints,
    capture_rng,
    check_resumable,
    complete_steps,
    resolve_resume,
    restore_rng,
)


def save(run, step, keep=None):
    report = RunCheckpoints(run, {}, is_writer=True, max_checkpoints=keep).save(step, {"x": step}, "a: 1\n")
    (report.path / "actor").mkdir()  # where the actor workers' checkpoint would be
    (report.path / "actor" / "megarl_checkpoint.json").write_text("{}")
    return report


def test_a_save_is_published_as_a_step_directory_and_latest_names_it(tmp_path):
    report = save(tmp_path, 2)
    root = tmp_path / "checkpoints"
    assert report.path == root / "step_2"
    assert (root / "latest").read_text() == "step_2\n"
    state = json.loads((root / "step_2" / "trainer_state.json").read_text())
    assert state == {"version": 1, "step": 2, "x": 2}
    assert (root / "step_2" / "config.yaml").read_text() == "a: 1\n"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_2"]  # no .partial, no .tmp left
    assert (root / "step_2" / "actor").is_dir()


def test_keep_last_k_deletes_the_oldest_and_never_latest(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep=2)
    assert complete_steps(tmp_path / "checkpoints") == ["step_3", "step_4"]
    assert resolve_resume("auto", tmp_path) == tmp_path / "checkpoints" / "step_4"


def test_an_interrupted_save_never_becomes_latest_and_the_next_save_removes_it(tmp_path):
    save(tmp_path, 2)
    root = tmp_path / "checkpoints"
    (root / "step_4.partial" / "actor").mkdir(parents=True)  # a save killed half way
    assert resolve_resume("auto", tmp_path) == root / "step_2"
    with pytest.raises(ResumeError, match=r"never completed \(only .*step_4.partial exists, interrupted\)"):
        resolve_resume(str(root / "step_4"), tmp_path)
    save(tmp_path, 6)
    assert not (root / "step_4.partial").exists()


def test_a_resumed_run_keeps_the_checkpoints_after_its_step_aside(tmp_path):
    for step in (2, 4, 6):
        save(tmp_path, step)
    root = tmp_path / "checkpoints"
    checkpoints = RunCheckpoints(tmp_path, {}, is_writer=True, max_checkpoints=2)
    assert checkpoints.supersede_after(2) == ["step_4", "step_6"]  # resumed from step_2
    assert (root / "latest").read_text() == "step_2\n"
    assert resolve_resume("auto", tmp_path) == root / "step_2"
    for step in (3, 4, 5):
        save(tmp_path, step, keep=2)
    names = sorted(p.name for p in root.iterdir())
    assert names == ["latest", "step_4", "step_4.superseded", "step_5", "step_6.superseded"]


def test_resume_accepts_a_step_directory_the_checkpoints_directory_or_the_run(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 3)
    step3 = tmp_path / "checkpoints" / "step_3"
    assert resolve_resume(str(tmp_path / "checkpoints" / "step_1"), "elsewhere").name == "step_1"
    assert resolve_resume(str(tmp_path / "checkpoints"), "elsewhere") == step3
    assert resolve_resume(str(tmp_path), "elsewhere") == step3
    assert resolve_resume("disable", tmp_path) is None
    assert resolve_resume("auto", tmp_path / "fresh") is None


def test_latest_pointing_at_a_missing_checkpoint_is_an_error_naming_it(tmp_path):
    save(tmp_path, 1)
    (tmp_path / "checkpoints" / "latest").write_text("step_9\n")
    with pytest.raises(ResumeError, match=r"latest names step_9, which does not exist"):
        resolve_resume("auto", tmp_path)


def test_a_path_that_is_no_checkpoint_is_an_error_saying_what_is_expected(tmp_path):
    with pytest.raises(ResumeError, match=r"is not a megarl checkpoint"):
        resolve_resume(str(tmp_path), "elsewhere")
    (tmp_path / "converted").mkdir()  # `megarl convert hf-to-mcore` output: weights only, no trainer state
    (tmp_path / "converted" / "megarl_checkpoint.json").write_text("{}")
    with pytest.raises(ResumeError, match=r"not a training run's checkpoint \(no trainer_state.json\)"):
        resolve_resume(str(tmp_path / "converted"), "elsewhere")


def test_a_trained_role_missing_from_the_checkpoint_is_named(tmp_path):
    step = save(tmp_path, 1).path
    check_resumable(step, ["actor", "ref"])
    with pytest.raises(ResumeError, match=r"no checkpoint of the critic role \(it has: actor\)"):
        check_resumable(step, ["actor", "critic"])


def test_driver_rng_states_round_trip_through_json():
    import random

    import numpy as np
    import torch

    state = json.loads(json.dumps(capture_rng()))
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


RL_STATE = {
    "version": 1,
    "step": 4,
    "job": "rl",
    "data": {"epoch": 0, "position": 8, "seed": 1, "n_rows": 16},
    "kl_ctrl": {"value": 0.001},
    "next_uid": 8,
    "best_val_reward": None,
    "bad_steps": {},
    "driver_rng": {},
}


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"step": "four"}, "field 'step' is \"four\", not a whole number ≥ 0"),
        ({"step": -1}, "field 'step' is -1, not a whole number ≥ 0"),
        ({"step": True}, "field 'step' is true, not a whole number ≥ 0"),
        ({"step": None}, "field 'step' is null, not a whole number ≥ 0"),
        ({"kl_ctrl": "missing"}, "field 'kl_ctrl' is missing"),
        ({"data": {"epoch": 0, "seed": 1}}, "field 'data.position' is missing"),
        ({"next_uid": 1.5}, "field 'next_uid' is 1.5, not a whole number ≥ 0"),
        ({"data_files": {}}, "field 'data_files' is {}, not a list of the training files' fingerprints"),
    ],
)
def test_a_damaged_trainer_state_names_the_file_and_the_field(tmp_path, edit, problem):
    from megarl.checkpoint.run import read_trainer_state

    step = tmp_path / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    state = {k: v for k, v in {**RL_STATE, **edit}.items() if v != "missing"}
    (step / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(ResumeError) as e:
        read_trainer_state(step)
    assert str(e.value) == (
        f"{step / 'trainer_state.json'}: {problem}; the file is damaged: resume from an earlier step directory "
        f"(trainer.resume={step.parent}/step_<N>) or start afresh with trainer.resume=disable"
    )


def test_trainer_state_that_is_not_json_or_not_an_object_is_named(tmp_path):
    from megarl.checkpoint.run import read_trainer_state

    (tmp_path / "trainer_state.json").write_text('{"step": 4,')
    with pytest.raises(ResumeError, match=r"trainer_state.json cannot be read \(JSONDecodeError: .*line 1"):
        read_trainer_state(tmp_path)
    (tmp_path / "trainer_state.json").write_text("[4]")
    with pytest.raises(ResumeError, match=r"trainer_state.json holds a JSON list, not the trainer's state"):
        read_trainer_state(tmp_path)
    (tmp_path / "trainer_state.json").write_text(
        json.dumps({"version": 1, "step": 3, "job": "sft", "data": {}})
    )
    assert read_trainer_state(tmp_path)["step"] == 3  # an offline job's state has no RL fields


def test_every_save_keeps_the_run_state_beside_the_trainers(tmp_path):
    files = [{"path": "/d/train.parquet", "bytes": 10, "sha256": "ab" * 32}]
    checkpoints = RunCheckpoints(tmp_path, {}, is_writer=True, run_state={"data_files": files})
    report = checkpoints.save(3, {"job": "sft"}, "a: 1\n")
    state = json.loads((report.path / "trainer_state.json").read_text())
    assert state == {"version": 1, "step": 3, "data_files": files, "job": "sft"}


def _full_disk_on(monkeypatch, name: str) -> None:
    """The fault: writing a file called `name` fails as on a full disk."""
    import errno
    import os
    from pathlib import Path

    write_text = Path.write_text

    def fails(self, *args, **kwargs):
        if self.name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", fails)


def test_a_full_disk_mid_save_is_one_message_and_the_previous_checkpoint_stays_latest(tmp_path, monkeypatch):
    from megarl.checkpoint.run import CheckpointSaveError

    save(tmp_path, 2)
    root = tmp_path / "checkpoints"
    before = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    _full_disk_on(monkeypatch, "config.yaml")
    with pytest.raises(CheckpointSaveError) as e:
        RunCheckpoints(tmp_path, {}, is_writer=True).save(4, {"x": 4}, "a: 1\n")
    message = str(e.value)
    assert message.startswith(
        f"saving checkpoint step_4 failed: no space left on the device of {root} (a checkpoint takes about "
    )
    assert message.endswith(
        " free); the unfinished save was removed and the previous checkpoint step_2 is intact and `latest` still "
        "names it. Free some space (trainer.max_checkpoints keeps fewer checkpoints) or move trainer.output_dir "
        "to a larger disk, then rerun to resume"
    )
    after = sorted((p.relative_to(root), p.stat().st_size) for p in root.rglob("*") if p.is_file())
    assert after == before and resolve_resume("auto", tmp_path) == root / "step_2"


class _FullDiskGroup:
    """A role group whose save fails the way a Ray worker's does on a full disk (the fault)."""

    def save_checkpoint(self, role_dir, meta):
        from pathlib import Path

        from megarl.controller.worker import WorkerError

        Path(role_dir).mkdir()
        (Path(role_dir) / "__0_0.distcp").write_bytes(b"\0" * 1000)  # what it wrote before the disk filled
        raise WorkerError(
            "actor.save_checkpoint failed on rank 0 of 2 on h (pid 7): OutputWriteError: no space left on the "
            f"device of {role_dir} (12 B free); free some space or write elsewhere\nTraceback (most recent …",
            "actor",
            0,
        )


def test_a_workers_full_disk_is_the_same_message_without_its_traceback(tmp_path):
    from megarl.checkpoint.run import CheckpointSaveError

    with pytest.raises(CheckpointSaveError) as e:
        RunCheckpoints(tmp_path, {"actor": _FullDiskGroup()}, is_writer=True).save(1, {}, "a: 1\n")
    assert str(e.value).startswith(
        f"saving checkpoint step_1 failed: no space left on the device of {tmp_path}"
    )
    assert "no earlier checkpoint exists" in str(e.value) and "Traceback" not in str(e.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []  # no step_1.partial left


def test_a_role_save_that_lost_its_cause_is_told_apart_by_the_space_left(tmp_path, monkeypatch):
    import errno
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    from megarl.checkpoint import role_common as role
    from megarl.output_guard import OutputWriteError

    enospc = OSError(errno.ENOSPC, "No space left on device")
    carried = CheckpointException("save", {1: (enospc, traceback.extract_stack())})
    assert str(role.save_failure(carried, tmp_path, 1)).startswith(
        f"no space left on the device of {tmp_path} ("
    )
    lost = CheckpointException("save", {})  # megatron's parallel writers: "ranks:dict_keys([])"
    error = role.save_failure(lost, tmp_path, 0)
    assert not isinstance(error, OutputWriteError)  # plenty of space here: not called a full disk
    assert str(error).startswith(
        f"saving {tmp_path} failed on rank 0: CheckpointException: CheckpointException"
    )
    monkeypatch.setattr(role, "free_bytes", lambda path: 4096)  # the fault: the disk is full
    assert str(role.save_failure(lost, tmp_path, 0)) == (
        f"no space left on the device of {tmp_path} (4.1 KB free); free some space or write elsewhere"
    )
