"""Which checkpoint a path names: role dirs, step dirs, `latest`, a run's checkpoints/ and the run itself."""

from pathlib import Path

import pytest

from megarl.checkpoint import format as checkpoint_format
from megarl.checkpoint.paths import (
    META_FILE,
    CheckpointNotFoundError,
    complete_steps,
    resolve_role_checkpoint,
)

pytestmark = pytest.mark.unit


def role_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / META_FILE).write_text("{}")
    (path / "optimizer").mkdir()  # training state beside the weights
    return path


@pytest.fixture
def run(tmp_path) -> Path:
    """RUN/checkpoints with step_2 and step_6 (actor + critic), latest = step_6, step_8 interrupted."""
    ckpts = tmp_path / "run" / "checkpoints"
    for step in ("step_2", "step_6"):
        for role in ("actor", "critic"):
            role_dir(ckpts / step / role)
    role_dir(ckpts / "step_8.partial" / "actor")
    (ckpts / "latest").write_text("step_6\n")
    return tmp_path / "run"


def test_constants_agree_with_the_checkpoint_writer(tmp_path):
    assert META_FILE == checkpoint_format.META_FILE
    assert checkpoint_format.partial_dir(tmp_path / "step_3").name == "step_3.partial"


@pytest.mark.parametrize("given", ["", "checkpoints", "checkpoints/latest", "checkpoints/step_6"])
def test_run_checkpoints_latest_and_step_resolve_to_the_role(run, given):
    assert resolve_role_checkpoint(run / given) == run / "checkpoints/step_6/actor"
    assert resolve_role_checkpoint(run / given, "critic") == run / "checkpoints/step_6/critic"


def test_a_role_or_converted_checkpoint_is_itself(run):
    actor = run / "checkpoints/step_2/actor"
    assert resolve_role_checkpoint(actor, role="critic") == actor


def test_steps_sort_numerically_and_skip_partial_saves(run):
    role_dir(run / "checkpoints/step_10/actor")
    assert complete_steps(run / "checkpoints") == ["step_2", "step_6", "step_10"]


def test_missing_role_names_the_roles_there(run):
    with pytest.raises(
        CheckpointNotFoundError, match=r"step_6 has no role 'reward' \(it has: actor, critic\)"
    ):
        resolve_role_checkpoint(run, "reward")


def test_only_an_interrupted_save_is_never_picked(tmp_path):
    ckpts = tmp_path / "checkpoints"
    role_dir(ckpts / "step_4.partial" / "actor")
    with pytest.raises(
        CheckpointNotFoundError, match=r"no complete checkpoint \(only step_4.partial, interrupted\)"
    ):
        resolve_role_checkpoint(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="interrupted save and is never loaded"):
        resolve_role_checkpoint(ckpts / "step_4.partial")
    with pytest.raises(CheckpointNotFoundError, match="was never completed"):
        resolve_role_checkpoint(ckpts / "step_4")


def test_latest_naming_a_missing_step_lists_what_exists(run):
    (run / "checkpoints/latest").write_text("step_9")
    with pytest.raises(
        CheckpointNotFoundError,
        match=r"names step_9, which does not exist; the run has complete: step_2, step_6; interrupted: step_8.partial",
    ):
        resolve_role_checkpoint(run)


def test_without_latest_the_complete_steps_are_named(run):
    (run / "checkpoints/latest").unlink()
    with pytest.raises(CheckpointNotFoundError, match=r"no 'latest' file .* e\.g\. .*step_6"):
        resolve_role_checkpoint(run)


def test_garbage_in_latest_is_reported(run):
    (run / "checkpoints/latest").write_text("../../etc")
    with pytest.raises(CheckpointNotFoundError, match="should name a step directory"):
        resolve_role_checkpoint(run / "checkpoints/latest")


def test_a_directory_that_is_nothing_of_the_kind(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointNotFoundError, match="is not a megarl checkpoint"):
        resolve_role_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_role_checkpoint(tmp_path / "nope")
