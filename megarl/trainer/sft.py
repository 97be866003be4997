"""SFTTrainer: supervised fine-tuning on Megatron with the actor's workers and layouts.

    megarl sft configs/quickstart_sft.yaml data.train_files=[sft.parquet] trainer.total_epochs=3

Each step is one optimizer step on `data.train_batch_size` (prompt, response) pairs, the loss the mean
negative log-likelihood of the response tokens (token-mean over the whole batch, whatever the TP/PP/DP
layout and micro-batching); validation reports the same on data.val_files as `val/loss`. At the end the
model is written as a Hugging Face checkpoint to `<trainer.output_dir>/hf`, which `megarl train` loads
as `model.path` (the loop: megarl.trainer.offline).
"""

from __future__ import annotations

import copy
from typing import TextIO

from megarl.config.schema import MegarlConfig
from megarl.config.validate import resolve_auto
from megarl.data.sft import load_sft_examples, sft_batch
from megarl.trainer.offline import OfflineTrainer
from megarl.trainer.rl_stages import role_metrics


def sft_config(cfg: MegarlConfig) -> MegarlConfig:
    """`cfg` for SFT: only the actor runs (no reference, critic or reward model)."""
    cfg = copy.deepcopy(cfg)
    cfg.algorithm.name = "sft"
    cfg.ref.enable = cfg.critic.enable = cfg.reward.enable = False
    cfg.rollout.temperature = 1.0  # log-probs (the validation loss) of the model itself, not of a sampler
    return resolve_auto(cfg)


class SFTTrainer(OfflineTrainer):
    job, items = "sft", "examples"

    def __init__(self, cfg: MegarlConfig, stream: TextIO | None = None) -> None:
        super().__init__(sft_config(cfg), stream)

    def load(self, files: list[str], config_key: str) -> list:
        return load_sft_examples(files, self.tokenizer, self.cfg.data, config_key)

    def train_step(self, indices: list[int]) -> tuple[dict[str, float], int]:
        batch = sft_batch([self.examples[i] for i in indices], self.pad)
        metrics = role_metrics("actor", self.roles.actor.sft_update(batch))
        metrics["sft/loss"] = metrics.pop("actor/loss")
        metrics["batch/sequences"] = float(len(indices))
        return metrics, int(batch["attention_mask"].sum())

    def validate(self) -> dict[str, float]:
        """Mean negative log-likelihood per response token over data.val_files."""
        batch = sft_batch(self.val_examples, self.pad)
        log_probs = self.roles.actor.log_prob(batch)["old_log_probs"]
        mask = batch["response_mask"]
        return {"val/loss": float(-(log_probs * mask).sum() / mask.sum())}
