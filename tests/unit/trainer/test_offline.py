"""The offline trainers' (SFT, preference) batch size and the checkpoint job check, without workers."""

from __future__ import annotations

import pytest

from megarl.checkpoint.run import RL_JOB, ResumeError, check_job
from megarl.data.files import DataError
from megarl.trainer.offline import offline_batch_size


@pytest.mark.parametrize(
    ("train_batch_size", "n_rows", "dp", "expected"),
    [(32, 1024, 2, 32), (32, 30, 4, 28), (32, 3, 4, 0), (8, 7, 1, 7), (6, 31, 2, 6)],
)
def test_a_step_holds_a_multiple_of_the_dp_size_and_no_padded_rows(train_batch_size, n_rows, dp, expected):
    if expected == 0:
        with pytest.raises(DataError, match="3 usable row.*fewer than the actor's 4 data-parallel ranks"):
            offline_batch_size(train_batch_size, n_rows, dp)
    else:
        assert offline_batch_size(train_batch_size, n_rows, dp) == expected


def test_a_checkpoint_of_another_job_is_refused_with_the_way_out(tmp_path):
    check_job(tmp_path, {"job": "dpo"}, "dpo")
    check_job(tmp_path, {}, RL_JOB)  # the RL trainer's checkpoints before the field existed
    with pytest.raises(
        ResumeError, match="saved by megarl dpo, but this run is megarl kto.*trainer.output_dir"
    ):
        check_job(tmp_path, {"job": "dpo"}, "kto")
    with pytest.raises(ResumeError, match=r"saved by megarl train \(RL\), but this run is megarl sft"):
        check_job(tmp_path, {}, "sft")


def _stepping_trainer(tmp_path, done: int):
    """An OfflineTrainer over 10 items, batches of 3 (3 steps an epoch), stopped after step `done`,
    whose step records its batch (no workers)."""
    from types import SimpleNamespace

    from megarl.config.schema import MegarlConfig
    from megarl.observe.progress import ProgressLog
    from megarl.trainer.offline import OfflineTrainer
    from megarl.trainer.roles import RoleGroups
    from megarl.trainer.run_session import RunSession

    cfg = MegarlConfig()
    cfg.trainer.output_dir, cfg.trainer.save_every, cfg.logging.report = str(tmp_path), -1, False
    trainer = OfflineTrainer.__new__(OfflineTrainer)
    trainer.cfg, trainer.examples, trainer.val_examples = cfg, list(range(10)), []
    trainer.batch_size, trainer.steps_per_epoch = 3, 3
    trainer.session = RunSession(
        cfg, "sft", 7, roles=RoleGroups(actor=SimpleNamespace(shutdown=lambda: None))
    )
    trainer.session._log = trainer.log = ProgressLog(tmp_path, 7, [])
    trainer.session.profiler = trainer.profiler = SimpleNamespace(step=lambda step: _nothing())
    trainer.start_step = trainer.done_step = done
    trainer._epoch_batches, trainer._began, trainer.last_metrics = None, False, {}
    seen = []
    trainer.train_step = lambda indices: (seen.append(indices) or {}, 1)
    return trainer, seen


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_offline_steps_walk_each_epochs_order_and_a_resumed_trainer_takes_up_the_next_batch(tmp_path):
    from megarl.data.sft import batches

    trainer, seen = _stepping_trainer(tmp_path / "a", done=0)
    metrics = [trainer.step() for _ in range(7)]
    seed = trainer.cfg.data.seed
    expected = [b for epoch in range(3) for b in batches(list(range(10)), 3, seed, epoch)][:7]
    assert seen == expected and [m["data/epoch"] for m in metrics] == [0, 0, 0, 1, 1, 1, 2]
    resumed, seen_after = _stepping_trainer(tmp_path / "b", done=4)
    resumed.step()
    assert seen_after == [expected[4]]
