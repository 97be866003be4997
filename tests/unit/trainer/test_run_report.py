"""An RLTrainer leaves a report of the run in its output_dir when it closes: after the last step, and
after a crash."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from megarl.checkpoint.run import RL_JOB
from megarl.config.schema import MegarlConfig
from megarl.observe.progress import ProgressLog
from megarl.trainer.bad_steps import BadStepCounter
from megarl.trainer.rl_trainer import RLTrainer
from megarl.trainer.roles import RoleGroups
from megarl.trainer.run_session import RunSession

pytestmark = pytest.mark.unit


def fit_without_workers(output_dir: Path, crash_at: int | None = None) -> None:
    """`RLTrainer.fit` over 3 steps whose `train_step` is a stand-in (no workers, no data), then close."""
    cfg = MegarlConfig()
    cfg.trainer.output_dir, cfg.trainer.total_steps = str(output_dir), 3
    cfg.trainer.save_every = -1
    trainer = RLTrainer.__new__(RLTrainer)  # the loop only: __init__ would start the workers
    trainer.cfg, trainer.val_data = cfg, None
    trainer.session = RunSession(
        cfg, RL_JOB, 3, roles=RoleGroups(actor=SimpleNamespace(shutdown=lambda: None))
    )
    trainer.session._log = trainer.log = ProgressLog(output_dir, 3, [])
    trainer.is_writer, trainer.output_dir = True, output_dir
    trainer.flow = SimpleNamespace(names=["generate"], describe=lambda: "generate")
    trainer.start_step = trainer.done_step = 0
    trainer.history, trainer._began = [], False
    trainer.bad_steps = BadStepCounter(max_in_a_row=3)

    def train_step(step: int) -> dict[str, float]:
        if step == crash_at:
            raise RuntimeError("worker died")
        return {"reward/mean": 0.1 * step, "timing/generate": 1.0, "step_seconds": 1.5}

    trainer.train_step = train_step
    with trainer:
        trainer.fit()


def test_a_finished_run_gets_its_report(tmp_path):
    fit_without_workers(tmp_path)
    text = (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "report" / "reward.png").is_file()
    assert "| training steps | 3 of 3 planned |" in text and "Incomplete" not in text


def test_a_crashed_run_gets_the_report_of_what_was_logged(tmp_path):
    with pytest.raises(RuntimeError, match="worker died"):
        fit_without_workers(tmp_path, crash_at=3)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "**Incomplete run.**" in text and "There is no summary.json" in text
    assert "| training steps | 2 |" in text
