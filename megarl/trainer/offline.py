"""The loop the offline trainers share (SFT, preference training): a data set loaded up front, steps of
`data.train_batch_size` examples in a (data.seed, epoch)-determined order (the last partial batch of an
epoch dropped), one optimizer step of the actor's workers each, validation, and the Hugging Face export.

    with SFTTrainer(cfg) as trainer:   # or DPOTrainer, KTOTrainer, …: workers start here
        metrics = trainer.step()       # one step: its metrics
        hf_dir = trainer.fit()         # the rest: train, validate, write <trainer.output_dir>/hf
    # leaving the block (or trainer.close()) stops the workers

Validation (data.val_files) runs before the first step (trainer.val_before_train, logged as step 0),
every trainer.eval_every steps and after the last. `<output_dir>/summary.json` holds the job, the last
step's metrics and the checkpoint path, and `report/report.md` the curves (logging.report, written at
close). A subclass loads its examples and defines one step and the validation; the run's lifecycle —
resume, logging, workers, profiling, checkpoints, shutdown — is its RunSession's.

Checkpoints are the RL trainer's (megarl.checkpoint.run): `trainer.save_every` /
`trainer.max_checkpoints` write `<output_dir>/checkpoints/step_<N>/actor/` (weights, optimizer, LR
schedule, RNG) atomically, and `trainer.resume` (auto by default) continues a run from one: the data
position is the step itself (the order is fixed by data.seed and the epoch), checked against the data
set's size and the batch size.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

from megarl.checkpoint.run import ResumeError, save_due
from megarl.config.schema import MegarlConfig
from megarl.data.chat import load_tokenizer
from megarl.data.files import DataError
from megarl.data.sft import batches
from megarl.observe.run_files import SUMMARY
from megarl.trainer.run_session import RunSession, SessionTrainer


def offline_batch_size(train_batch_size: int, n_rows: int, dp: int) -> int:
    """Items per step: data.train_batch_size, or all usable rows when fewer, rounded down to a multiple
    of the actor's data-parallel size (a padded share would train on repeated rows)."""
    size = min(train_batch_size, n_rows) // dp * dp
    if size == 0:
        raise DataError(
            f"data.train_files has {n_rows} usable row(s), fewer than the actor's {dp} data-parallel ranks; "
            "add data or use fewer ranks"
        )
    return size


class OfflineTrainer(SessionTrainer):
    job = "offline"  # the command name, in messages and the summary file's name
    items = "examples"  # what one training item is called in messages

    def __init__(self, cfg: MegarlConfig, stream: TextIO | None = None) -> None:
        """`cfg` is already this job's (resolved); loads the data, then starts the workers."""
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.model)
        self.pad = self.tokenizer.pad_token_id
        self.examples = self.load(cfg.data.train_files, "data.train_files")
        self.val_examples = self.load_val(cfg.data.val_files, "data.val_files") if cfg.data.val_files else []
        self.batch_size = offline_batch_size(
            cfg.data.train_batch_size, len(self.examples), cfg.layout("actor").dp
        )
        self.steps_per_epoch = len(self.examples) // self.batch_size
        total_steps = cfg.trainer.total_steps or cfg.trainer.total_epochs * self.steps_per_epoch
        self.output_dir = Path(cfg.trainer.output_dir)
        # trainer.resume: the checkpoint to continue from, checked before any worker starts
        self.session = session = RunSession(cfg, self.job, total_steps, stream)
        self.resume_from = session.resume_from
        if session.resumed is not None:
            try:
                self._check_data_position(session.resumed.get("data", {}))
            except ResumeError:
                session.close()  # the run lock
                raise
        self.start_step = self.done_step = session.start_step
        self.is_writer = session.is_writer
        self.last_metrics: dict[str, Any] = {}  # the last step's
        self._epoch_batches: tuple[int, list[list[int]]] | None = None
        self._began = False
        try:  # stop the workers and close the logging backends if anything below fails
            self.roles = session.start()
            self.log, self.profiler, self.checkpoints = session.log, session.profiler, session.checkpoints
            session.resume_groups()
        except BaseException:
            self.close()
            raise

    def _data_position(self) -> dict[str, int]:
        return {"seed": self.cfg.data.seed, "n_rows": len(self.examples), "batch_size": self.batch_size}

    def _check_data_position(self, saved: dict[str, int]) -> None:
        ours = self._data_position()
        changed = [f"{k} {saved.get(k)} → {v}" for k, v in ours.items() if saved.get(k) != v]
        if changed:
            raise ResumeError(
                f"{self.resume_from}: the saved data position does not fit this run's data ({', '.join(changed)}: "
                "data.seed, the usable rows of data.train_files, data.train_batch_size); resume with the same "
                "data, or start afresh with trainer.resume=disable"
            )

    # ---- what a subclass defines ---------------------------------------------------------------------

    def load(self, files: list[str], config_key: str) -> list:
        """The training items of `files` (DataError when none is usable)."""
        raise NotImplementedError

    def load_val(self, files: list[str], config_key: str) -> list:
        return self.load(files, config_key)

    def before_training(self) -> None:
        """Work after the workers started and before validation at step 0 (e.g. precomputing)."""

    def train_step(self, indices: list[int]) -> tuple[dict[str, float], int]:
        """One optimizer step on the training items at `indices`: (its metrics, real tokens in it)."""
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        """Metrics over the validation items, named `val/…`."""
        raise NotImplementedError

    # ---- the loop ------------------------------------------------------------------------------------

    def fit(self, total_steps: int | None = None) -> Path:
        """Train the steps after the last one done up to `total_steps` (default: the current target,
        trainer.total_steps at first), validate, then export; returns the HF checkpoint directory. The
        workers keep running: a later `fit(total_steps=…)` continues."""
        self._retarget(total_steps)
        self.log.message(
            f"megarl {self.job}: {len(self.examples)} {self.items}, {self.total_steps} steps of "
            f"{self.batch_size} on {self.cfg.model.path}"
        )
        if (nothing_left := self.session.nothing_left(self.done_step, exports=True)) is not None:
            self.log.warn(nothing_left)
        self._begin()
        self._train_to_target()  # a stop signal ends it after a step, with a checkpoint (Preempted)
        return self._export(self.last_metrics)

    def step(self) -> dict[str, float]:
        """Train the step after the last one done (validating and saving when due, logged as `fit` logs
        it) and return its metrics. A step past the target makes it the target (and so the last)."""
        self._begin()
        step = self._next_step()
        epoch, index = divmod(step - 1, self.steps_per_epoch)  # the data position is the step
        indices = self._batches_of(epoch)[index]
        with self.profiler.step(step):
            start = time.perf_counter()
            metrics, tokens = self.train_step(indices)
            seconds = time.perf_counter() - start
        # step_seconds = the update + a save; validation is timed on its own (as in RL runs)
        metrics.update(
            {
                "timing/update_actor": seconds,
                "step_seconds": seconds,
                "throughput/tokens_per_s": tokens / seconds,
                "data/epoch": epoch,
            }
        )
        every, last = self.cfg.trainer.eval_every, step == self.total_steps
        if self.val_examples and (last or (every and step % every == 0)):
            metrics.update(self._validate())
        if save_due(step, self.total_steps, self.cfg.trainer.save_every):
            metrics.update(self.save_checkpoint(step))
            metrics["step_seconds"] += metrics["timing/save_checkpoint"]
        self.log.log(step, metrics)
        self.done_step, self.last_metrics = step, metrics
        return metrics

    def _begin(self) -> None:
        """Once per trainer, before its first step: `before_training`, then validation at step 0 (a
        fresh run with trainer.val_before_train)."""
        if self._began:
            return
        self._began = self.session.began_training = True
        self.before_training()
        if self.start_step == 0 and self.val_examples and self.cfg.trainer.val_before_train:
            self.log.log(0, self._validate())

    def _batches_of(self, epoch: int) -> list[list[int]]:
        """The batches of `epoch`, in their (data.seed, epoch) order."""
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            order = list(range(len(self.examples)))
            self._epoch_batches = (epoch, list(batches(order, self.batch_size, self.cfg.data.seed, epoch)))
        return self._epoch_batches[1]

    def save_checkpoint(self, step: int) -> dict[str, float]:
        """Save the trained roles and the data position as checkpoints/step_<step>; its metrics."""
        from megarl.config import config_to_yaml

        with self.log.task(f"saving checkpoint step_{step}"):
            state = {"job": self.job, "data": self._data_position()}
            report = self.checkpoints.save(step, state, config_to_yaml(self.cfg))
        return report.metrics()

    def _validate(self) -> dict[str, float]:
        start = time.perf_counter()
        with self.log.task(f"validation on {len(self.val_examples)} {self.items}"):
            metrics = self.validate()
        return {**metrics, "timing/validate": time.perf_counter() - start}

    def _export(self, metrics: dict[str, Any]) -> Path:
        with self.log.task(f"writing the Hugging Face checkpoint to {self.output_dir / 'hf'}"):
            out = self.roles.actor.export_hf(str(self.output_dir / "hf"))[0]
        if self.roles.is_writer:
            self.log.message(f"megarl {self.job}: wrote the Hugging Face checkpoint {out}")
            summary = {"job": self.job, "steps": self.total_steps, "hf_checkpoint": out, **metrics}
            (self.output_dir / SUMMARY).write_text(json.dumps(summary, indent=2))
        return Path(out)
