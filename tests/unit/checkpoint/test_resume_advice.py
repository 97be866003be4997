"""The line a failed run ends with says what rerunning does, read from the checkpoints on disk: it never
promises a resume where there is no checkpoint to resume from."""

from __future__ import annotations

import pytest

from megarl.checkpoint.run import RunCheckpoints, resume_advice

pytestmark = pytest.mark.unit


def _save(run, step):
    report = RunCheckpoints(run, {}, is_writer=True).save(step, {"x": step}, "a: 1\n")
    (report.path / "actor").mkdir()
    (report.path / "actor" / "megarl_checkpoint.json").write_text("{}")


def test_no_checkpoint_yet_says_the_rerun_starts_from_step_0(tmp_path):
    assert resume_advice(tmp_path, "auto") == (
        f"no checkpoint was saved under {tmp_path / 'checkpoints'}, so rerunning starts from step 0 "
        "(trainer.save_every=N saves every N steps)"
    )
    (tmp_path / "checkpoints" / "step_2.partial").mkdir(parents=True)  # a save the failure interrupted
    assert resume_advice(tmp_path, "auto").startswith("no checkpoint was saved under")


def test_a_checkpoint_names_the_step_the_rerun_resumes_from(tmp_path):
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    step_4 = tmp_path / "checkpoints" / "step_4"
    assert (
        resume_advice(tmp_path, "auto")
        == f"rerun the same command to resume from {step_4} (trainer.resume=auto)"
    )
    assert resume_advice(tmp_path, "disable") == (
        f"rerunning starts afresh (trainer.resume=disable); rerun with trainer.resume=auto to resume from {step_4}"
    )
    step_2 = tmp_path / "checkpoints" / "step_2"
    assert resume_advice(tmp_path, str(step_2)) == (
        f"rerunning resumes from trainer.resume={step_2} again; rerun with trainer.resume=auto to resume from "
        f"{step_4}"
    )


def test_disable_without_checkpoints_starts_afresh(tmp_path):
    assert resume_advice(tmp_path, "disable") == "rerunning starts afresh (trainer.resume=disable)"
