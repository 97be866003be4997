"""SFTTrainer: supervised fine-tuning on Megatron with the actor's workers and layouts.

    megarl sft configs/quickstart_sft.yaml data.train_files=[sft.parquet] trainer.total_epochs=3

Each step is one optimizer step on `data.train_batch_size` (prompt, response) pairs, the loss the mean
negative log-likelihood of the response tokens (token-mean over the whole batch, whatever the TP/PP/DP
layout and micro-batching). At the end the model is written as a Hugging Face checkpoint to
`<trainer.output_dir>/hf`, which `megarl train` loads as `model.path`.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import TextIO

from megarl.config.schema import MegarlConfig
from megarl.config.validate import resolve_auto
from megarl.data.sft import load_sft_examples, sft_batches
from megarl.observe.profiling import StepProfiler
from megarl.observe.progress import ProgressLog, format_duration
from megarl.trainer.rl_stages import role_metrics
from megarl.trainer.roles import build_roles, is_writer_process


def sft_config(cfg: MegarlConfig) -> MegarlConfig:
    """`cfg` for SFT: only the actor runs (no reference, critic or reward model)."""
    cfg = copy.deepcopy(cfg)
    cfg.algorithm.name = "sft"
    cfg.ref.enable = cfg.critic.enable = cfg.reward.enable = False
    cfg.rollout.temperature = 1.0  # log-probs (the validation loss) of the model itself, not of a sampler
    return resolve_auto(cfg)


class SFTTrainer:
    def __init__(self, cfg: MegarlConfig, stream: TextIO | None = None) -> None:
        from transformers import AutoTokenizer

        self.cfg = cfg = sft_config(cfg)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
        self.examples = load_sft_examples(cfg.data.train_files, self.tokenizer, cfg.data, "data.train_files")
        self.val_examples = (
            load_sft_examples(cfg.data.val_files, self.tokenizer, cfg.data, "data.val_files")
            if cfg.data.val_files
            else []
        )
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

    def close(self) -> None:
        """Stop the workers and flush and close the logging backends; idempotent."""
        try:
            if self.roles is not None:
                self.roles.shutdown()
        finally:
            self.log.close()

    def fit(self) -> Path:
        """Train, then export; returns the HF checkpoint directory."""
        try:
            pad = self.tokenizer.pad_token_id
            self.log.message(
                f"megarl sft: {len(self.examples)} examples, {self.total_steps} steps of {self.batch_size} on "
                f"{self.cfg.model.path}"
            )
            step, epoch, epoch_start = 0, 0, time.perf_counter()
            while step < self.total_steps:
                for batch in sft_batches(self.examples, self.batch_size, self.cfg.data.seed, epoch, pad):
                    step += 1
                    with self.profiler.step(step):
                        start = time.perf_counter()
                        metrics = role_metrics("actor", self.roles.actor.sft_update(batch))
                        seconds = time.perf_counter() - start
                    metrics["sft/loss"] = metrics.pop("actor/loss")
                    metrics.update(
                        {
                            "step_seconds": seconds,
                            "throughput/tokens_per_s": float(batch["attention_mask"].sum()) / seconds,
                            "data/epoch": epoch,
                        }
                    )
                    if step == self.total_steps and self.val_examples:
                        with self.log.task(f"validation loss on {len(self.val_examples)} examples"):
                            metrics["val/loss"] = self.validation_loss()
                    self.log.log(step, metrics)
                    if step == self.total_steps:
                        break
                else:
                    if self.steps_per_epoch > 1:  # else the step lines say it all
                        self.log.message(
                            f"sft: epoch {epoch + 1} done at step {step}/{self.total_steps} in "
                            f"{format_duration(time.perf_counter() - epoch_start)}, loss {metrics['sft/loss']:.4f}"
                        )
                    epoch_start = time.perf_counter()
                epoch += 1
            with self.log.task(f"writing the Hugging Face checkpoint to {self.output_dir / 'hf'}"):
                out = self.roles.actor.export_hf(str(self.output_dir / "hf"))[0]
            if self.roles.is_writer:
                self.log.message(f"megarl sft: wrote the Hugging Face checkpoint {out}")
                (self.output_dir / "sft_summary.json").write_text(
                    json.dumps({"steps": self.total_steps, "hf_checkpoint": out, **metrics}, indent=2)
                )
            return Path(out)
        finally:
            self.close()

    def validation_loss(self) -> float:
        """Mean negative log-likelihood per response token over data.val_files."""
        from megarl.data.sft import sft_batch

        batch = sft_batch(self.val_examples, self.tokenizer.pad_token_id)
        log_probs = self.roles.actor.log_prob(batch)["old_log_probs"]
        mask = batch["response_mask"]
        return float(-(log_probs * mask).sum() / mask.sum())
