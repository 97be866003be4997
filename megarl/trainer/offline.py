"""The loop the offline trainers share (SFT, preference training): a data set loaded up front, steps of
`data.train_batch_size` examples in a (data.seed, epoch)-determined order (the last partial batch of an
epoch dropped), one optimizer step of the actor's workers each, validation, and the Hugging Face export.

    trainer = SFTTrainer(cfg)     # or DPOTrainer, KTOTrainer, …: workers start here
    hf_dir = trainer.fit()        # train, validate, write <trainer.output_dir>/hf; workers stop

Validation (data.val_files) runs before the first step (trainer.val_before_train, logged as step 0),
every trainer.eval_every steps and after the last. `<output_dir>/summary.json` holds the job, the last
step's metrics and the checkpoint path, and `report/report.md` the curves (logging.report). A subclass loads its examples and defines one step and the
validation; everything else — workers, logging, profiling, checkpoints, shutdown — is here.

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

from megarl.checkpoint.run import (
    ResumeError,
    RunCheckpoints,
    check_job,
    check_resumable,
    precheck_roles,
    read_trainer_state,
    resolve_resume,
    save_due,
)
from megarl.config.schema import MegarlConfig
from megarl.data.files import DataError
from megarl.data.sft import batches
from megarl.observe.profiling import StepProfiler
from megarl.observe.progress import ProgressLog
from megarl.observe.report import try_write_report
from megarl.observe.run_files import SUMMARY, write_run_files
from megarl.trainer.roles import build_roles, is_writer_process


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


class OfflineTrainer:
    job = "offline"  # the command name, in messages and the summary file's name
    items = "examples"  # what one training item is called in messages

    def __init__(self, cfg: MegarlConfig, stream: TextIO | None = None) -> None:
        """`cfg` is already this job's (resolved); loads the data, then starts the workers."""
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
        self.pad = self.tokenizer.pad_token_id
        self.examples = self.load(cfg.data.train_files, "data.train_files")
        self.val_examples = self.load_val(cfg.data.val_files, "data.val_files") if cfg.data.val_files else []
        self.batch_size = offline_batch_size(
            cfg.data.train_batch_size, len(self.examples), cfg.layout("actor").dp
        )
        self.steps_per_epoch = len(self.examples) // self.batch_size
        self.total_steps = cfg.trainer.total_steps or cfg.trainer.total_epochs * self.steps_per_epoch
        self.output_dir = Path(cfg.trainer.output_dir)
        # trainer.resume: the checkpoint to continue from, checked before any worker starts
        self.resume_from = resolve_resume(cfg.trainer.resume, self.output_dir)
        resumed = read_trainer_state(self.resume_from) if self.resume_from is not None else None
        if resumed is not None:
            check_job(self.resume_from, resumed, self.job)
            check_resumable(self.resume_from, ["actor"])
            precheck_roles(self.resume_from, cfg, self.total_steps, ["actor"])
            self._check_data_position(resumed.get("data", {}))
        self.start_step = resumed["step"] if resumed is not None else 0
        self.roles = None
        self.is_writer = writer = is_writer_process(cfg)
        self.log = ProgressLog.for_run(
            cfg, self.total_steps, writer, stream, resume_step=self.start_step if resumed else None
        )
        try:
            if writer:  # config.yaml + run_info.json (machine, layout)
                write_run_files(cfg, self.output_dir)
            with self.log.task("starting the actor's workers"):
                self.roles = build_roles(cfg, self.total_steps)
            self.profiler = StepProfiler.for_run(cfg, {"actor": self.roles.actor}, self.roles.is_writer)
            spmd = cfg.trainer.launcher == "torchrun"
            groups = {"actor": self.roles.actor}
            self.checkpoints = RunCheckpoints(
                self.output_dir, groups, self.roles.is_writer, cfg.trainer.max_checkpoints, spmd
            )
            if resumed is not None:
                with self.log.task(f"resuming from {self.resume_from}"):
                    self.roles.actor.load_checkpoint(str(self.resume_from / "actor"))
            if self.roles.is_writer and (superseded := self.checkpoints.supersede_after(self.start_step)):
                self.log.warn(
                    f"megarl {self.job}: checkpoints after step {self.start_step} belong to another run's "
                    f"future; kept aside as {', '.join(n + '.superseded' for n in superseded)}"
                )
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

    def close(self) -> None:
        """Stop the workers and flush and close the logging backends; idempotent."""
        try:
            if self.roles is not None:
                self.roles.shutdown()
        finally:
            self.log.close()

    def fit(self) -> Path:
        """Train, validate, then export; returns the HF checkpoint directory."""
        try:
            self.log.message(
                f"megarl {self.job}: {len(self.examples)} {self.items}, {self.total_steps} steps of "
                f"{self.batch_size} on {self.cfg.model.path}"
            )
            if self.start_step >= self.total_steps:
                self.log.warn(
                    f"megarl {self.job}: {self.resume_from} is at step {self.start_step}, trainer.total_steps="
                    f"{self.total_steps}: nothing left to train; exporting it (trainer.resume=disable starts afresh)"
                )
            self.before_training()
            fresh = self.start_step == 0
            if fresh and self.val_examples and self.cfg.trainer.val_before_train:
                self.log.log(0, self._validate())
            metrics = self._train()
            return self._export(metrics)
        finally:
            self.close()
            if self.is_writer and self.cfg.logging.report:  # also after a crash; never raises
                try_write_report(self.output_dir, self.log.message)

    def _train(self) -> dict[str, float]:
        every, step, metrics = self.cfg.trainer.eval_every, self.start_step, {}
        epoch, done_in_epoch = divmod(step, self.steps_per_epoch)  # a resumed run's data position
        while step < self.total_steps:
            order = list(range(len(self.examples)))
            epoch_batches = batches(order, self.batch_size, self.cfg.data.seed, epoch)
            for _ in range(done_in_epoch):
                next(epoch_batches)
            done_in_epoch = 0
            for indices in epoch_batches:
                step += 1
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
                last = step == self.total_steps
                if self.val_examples and (last or (every and step % every == 0)):
                    metrics.update(self._validate())
                if save_due(step, self.total_steps, self.cfg.trainer.save_every):
                    metrics.update(self._save(step))
                    metrics["step_seconds"] += metrics["timing/save_checkpoint"]
                self.log.log(step, metrics)
                if last:
                    break
            epoch += 1
        return metrics

    def _save(self, step: int) -> dict[str, float]:
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
