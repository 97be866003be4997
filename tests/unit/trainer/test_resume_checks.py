"""Resume that cannot go wrong silently: the RunSession of a resumed run, before any worker starts,
compares the training files' bytes with the checkpoint's and says when nothing is left to train."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from megarl.checkpoint.run import ResumeError
from megarl.config import load_config
from megarl.data.files import fingerprint_files
from megarl.trainer.run_session import RunSession
from tests.helpers.checkpoints import fake_run
from tests.helpers.data import write_jsonl

pytestmark = [pytest.mark.unit, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

SFT = Path(__file__).resolve().parents[3] / "configs" / "quickstart_sft.yaml"


def sft_rows(task: str) -> list[dict[str, str]]:
    return [{"prompt": f"{task} {d}", "response": d[::-1]} for d in ("123", "4567", "89")]


@pytest.fixture
def run(tiny_models, tmp_path) -> dict[str, Path]:
    """A run at step 2 of `sft` on train.jsonl, and a same-size file of another task."""
    train = Path(write_jsonl(tmp_path / "train.jsonl", sft_rows("reverse")))
    other = Path(write_jsonl(tmp_path / "other.jsonl", sft_rows("sorted")))
    role = fake_run(tiny_models["llama"], tmp_path / "run", step=2)
    state_file = role.parent / "trainer_state.json"
    state = json.loads(state_file.read_text())
    data = {"seed": 1, "n_rows": 3, "batch_size": 2}
    state_file.write_text(json.dumps({**state, "data": data, "data_files": fingerprint_files([str(train)])}))
    return {
        "run": tmp_path / "run",
        "train": train,
        "other": other,
        "state": state_file,
        "model": tiny_models["llama"],
    }


def session(run: dict[str, Path], train: Path, total_steps: int = 4) -> RunSession:
    cfg = load_config(
        SFT,
        [f"model.path={run['model']}", f"data.train_files=[{train}]", f"trainer.output_dir={run['run']}"],
    )
    return RunSession(cfg, "sft", total_steps)


def test_resume_on_other_data_of_the_same_size_names_both_files(run):
    with pytest.raises(ResumeError) as e:
        session(run, run["other"])
    message = str(e.value)
    assert message.startswith(
        f"{run['state'].parent} was trained on other data: data.train_files = {run['other']} ("
    )
    assert f"the checkpoint's were {run['train']} (" in message
    assert message.endswith(
        "Resume with the files it was trained on, or start afresh with trainer.resume=disable "
        "(or another trainer.output_dir)"
    )


def test_the_same_bytes_elsewhere_resume_and_a_checkpoint_without_fingerprints_says_so(run, tmp_path):
    moved = tmp_path / "moved.jsonl"
    shutil.copy(run["train"], moved)
    s = session(run, moved)
    assert s.start_step == 2 and s.notes == []
    s.close()
    state = json.loads(run["state"].read_text())
    del state["data_files"]  # saved by megarl before fingerprints
    run["state"].write_text(json.dumps(state))
    s = session(run, run["other"])
    assert s.notes == [
        f"megarl sft: {run['state'].parent} holds no fingerprint of its training files (saved by an earlier "
        "megarl): only their row count and data.seed are compared"
    ]
    s.close()


def test_a_run_already_at_its_last_step_says_there_is_nothing_left(run):
    s = session(run, run["train"], total_steps=2)
    assert s.nothing_left(2, exports=True) == (
        f"megarl sft: {run['state'].parent} is at step 2 and this run ends at step 2 (trainer.total_steps or its "
        "epochs): nothing left to train; writing its Hugging Face export. Raise trainer.total_steps to train "
        "further, or start afresh with trainer.resume=disable"
    )
    s.close()
    s = session(run, run["train"], total_steps=3)
    assert s.nothing_left(2, exports=True) is None
    s.close()
