"""The loop the offline trainers share (SFT, preference training): a data set loaded up front, steps of
`data.train_batch_size` examples in a (data.seed, epoch)-determined order (the last partial batch of an
epoch dropped), one optimizer step of the actor's workers each, validation, and the Hugging Face export.

    trainer = SFTTrainer(cfg)     # or DPOTrainer, KTOTrainer, …: workers start here
    hf_dir = trainer.fit()        # train, validate, write <trainer.output_dir>/hf; workers stop

Validation (data.val_files) runs before the first step (trainer.val_before_train, logged as step 0),
every trainer.eval_every steps and after the last. `<output_dir>/<job>_summary.json` holds the last
step's metrics and the checkpoint path. A subclass loads its examples and defines one step and the
validation; everything else — workers, logging, profiling, shutdown — is here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

from megarl.config.schema import MegarlConfig
from megarl.data.sft import batches
from megarl.observe.profiling import StepProfiler
from megarl.observe.progress import ProgressLog
from megarl.trainer.roles import build_roles, is_writer_process


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
        self.batch_size = min(cfg.data.train_batch_size, len(self.examples))
        self.steps_per_epoch = len(self.examples) // self.batch_size
        self.total_steps = cfg.trainer.total_steps or cfg.trainer.total_epochs * self.steps_per_epoch
        self.output_dir = Path(cfg.trainer.output_dir)
        self.roles = None
        self.log = ProgressLog.for_run(cfg, self.total_steps, is_writer_process(cfg), stream)
        try:
            with self.log.task("starting the actor's workers"):
                self.roles = build_roles(cfg, self.total_steps)
            self.profiler = StepProfiler.for_run(cfg, {"actor": self.roles.actor}, self.roles.is_writer)
        except BaseException:
            self.close()
            raise

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
            self.before_training()
            if self.val_examples and self.cfg.trainer.val_before_train:
                self.log.log(0, self._validate())
            metrics = self._train()
            return self._export(metrics)
        finally:
            self.close()

    def _train(self) -> dict[str, float]:
        every, step, epoch, metrics = self.cfg.trainer.eval_every, 0, 0, {}
        while step < self.total_steps:
            order = list(range(len(self.examples)))
            for indices in batches(order, self.batch_size, self.cfg.data.seed, epoch):
                step += 1
                with self.profiler.step(step):
                    start = time.perf_counter()
                    metrics, tokens = self.train_step(indices)
                    seconds = time.perf_counter() - start
                metrics.update(
                    {
                        "step_seconds": seconds,
                        "throughput/tokens_per_s": tokens / seconds,
                        "data/epoch": epoch,
                    }
                )
                last = step == self.total_steps
                if self.val_examples and (last or (every and step % every == 0)):
                    metrics.update(self._validate())
                self.log.log(step, metrics)
                if last:
                    break
            epoch += 1
        return metrics

    def _validate(self) -> dict[str, float]:
        with self.log.task(f"validation on {len(self.val_examples)} {self.items}"):
            return self.validate()

    def _export(self, metrics: dict[str, Any]) -> Path:
        with self.log.task(f"writing the Hugging Face checkpoint to {self.output_dir / 'hf'}"):
            out = self.roles.actor.export_hf(str(self.output_dir / "hf"))[0]
        if self.roles.is_writer:
            self.log.message(f"megarl {self.job}: wrote the Hugging Face checkpoint {out}")
            summary = {"job": self.job, "steps": self.total_steps, "hf_checkpoint": out, **metrics}
            (self.output_dir / f"{self.job}_summary.json").write_text(json.dumps(summary, indent=2))
        return Path(out)
