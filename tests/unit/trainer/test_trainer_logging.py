"""The trainer's logging backends and profiler around its worker groups (fake groups: no processes)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from megarl.config import load_config
from megarl.observe.backends import TensorBoardSink
from megarl.trainer.rl_trainer import RLTrainer
from megarl.trainer.roles import RoleGroups
from tests.helpers.data import verl_row, write_parquet

pytestmark = pytest.mark.unit

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "quickstart_grpo.yaml"


class FailingGroup:
    """A worker group whose every call fails, except the profiling ones, which it records."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start_profile(self, step, out_dir, ranks):
        self.calls.append(("start_profile", step, out_dir, ranks))

    def shutdown(self):
        self.calls.append(("shutdown",))

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise RuntimeError(f"{name} failed on rank 1")

        return call


def test_a_failing_step_still_shuts_the_workers_down_and_closes_the_backends(
    tiny_models, tmp_path, monkeypatch
):
    closed = []
    monkeypatch.setattr(TensorBoardSink, "close", lambda self: closed.append(self.log_dir))
    rows = [verl_row(f"reverse {d}", d[::-1], data_source="megarl/digits_reverse") for d in ("123", "4567")]
    overrides = [
        f"model.path={tiny_models['llama']}",
        f"data.train_files=[{write_parquet(tmp_path / 'train.parquet', rows)}]",
        "data.val_files=[]",
        "trainer.eval_every=0",
        "trainer.total_steps=2",
        "trainer.profile_steps=[1]",
        "data.train_batch_size=2",
        "algorithm.ppo_mini_batch_size=2",
        "actor.micro_batch_size=8",
        "ref.micro_batch_size=8",
        f"trainer.output_dir={tmp_path / 'run'}",
        "logging.backends=[console,tensorboard]",
    ]
    actor, ref = FailingGroup(), FailingGroup()
    out = io.StringIO()
    trainer = RLTrainer(load_config(CONFIG, overrides), roles=RoleGroups(actor=actor, ref=ref), stream=out)
    with pytest.raises(RuntimeError, match="generate failed on rank 1"), trainer:
        trainer.fit()
    assert actor.calls == [
        ("start_profile", 1, str(tmp_path / "run" / "profile" / "step_1"), [0]),
        ("shutdown",),
    ]
    assert ref.calls == [("shutdown",)]
    assert closed == [tmp_path / "run" / "tensorboard"] and trainer.log.sinks == []
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""
