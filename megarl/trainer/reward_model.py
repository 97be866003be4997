"""Reward-model training on Megatron: a scalar-head model learns to score the chosen answer of each
preference pair above the rejected one (the Bradley–Terry loss), with the actor's workers, layouts and
optimizer settings and the loop SFT and DPO use (megarl.trainer.offline).

    megarl rm configs/quickstart_rm.yaml data.train_files=[pairs.parquet]
    hf_dir = train_reward_model(cfg)            # the Python API's entry: the exported classifier
    with RewardModelTrainer(cfg) as t: t.fit()  # step by step: t.step()

The model starts from `model.path`: a language model gets a fresh scalar head in place of its LM head
(as the critic does), a `*ForSequenceClassification` checkpoint (num_labels=1) keeps its head. A
response's score is the head's output at its last token — EOS, which the pairs' responses end with, as
rollouts do — exactly what the RL trainer's reward model computes. Data: the preference pairs of
`megarl dpo` (megarl.data.preference: prompt / chosen / rejected, TRL's and verl's forms).

Each step is one optimizer step on `data.train_batch_size` pairs, the loss the mean −log σ(r_c − r_r)
over them whatever the TP/PP/DP layout and micro-batching (`actor.micro_batch_size` counts pairs; a
micro-batch holds whole pairs). Metrics: `rm/loss`, `rm/accuracy` (pairs ranked right), `rm/margin`
(mean r_c − r_r), `rm/chosen`, `rm/rejected`, `rm/grad_norm`; validation (data.val_files, at step 0,
every trainer.eval_every steps and after the last) the same under `val/rm/`. Checkpoints and resume
are the other offline jobs' (`<output_dir>/checkpoints/step_<N>/actor/`, bit-exact).

At the end the model is written to `<trainer.output_dir>/hf` as a Hugging Face sequence classifier
(`LlamaForSequenceClassification`, `Qwen2ForSequenceClassification`, …: num_labels=1, `score.weight`,
pad_token_id set), which `transformers.AutoModelForSequenceClassification` loads and the RL trainer
uses as `reward.model_path` (reward.backend=megatron, or hf).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TextIO, cast

from megarl.algorithms.reward_model import bradley_terry_loss
from megarl.config.schema import MegarlConfig
from megarl.config.validate import resolve_auto
from megarl.data.preference import load_preference_pairs, pair_batch
from megarl.trainer.offline import OfflineTrainer
from megarl.trainer.rl_stages import role_metrics
from megarl.workers.groups import RewardTrainerGroup


def rm_config(cfg: MegarlConfig) -> MegarlConfig:
    """`cfg` for reward-model training: only the model being trained runs, in the actor's place (no
    reference, critic, reward model or rollout sampling)."""
    cfg = copy.deepcopy(cfg)
    cfg.algorithm.name = "rm"
    cfg.ref.enable = cfg.critic.enable = cfg.reward.enable = False
    cfg.rollout.temperature = 1.0
    return resolve_auto(cfg)


class RewardModelTrainer(OfflineTrainer):
    job, items = "rm", "pairs"

    def __init__(self, cfg: MegarlConfig, stream: TextIO | None = None) -> None:
        super().__init__(rm_config(cfg), stream)

    @property
    def model(self) -> RewardTrainerGroup:
        """The reward model's worker group (the rm job starts it in the actor's place)."""
        return cast(RewardTrainerGroup, self.roles.actor)

    def load(self, files: list[str], config_key: str) -> list:
        return load_preference_pairs(files, self.tokenizer, self.cfg.data, config_key)

    def train_step(self, indices: list[int]) -> tuple[dict[str, float], int]:
        batch = pair_batch([self.examples[i] for i in indices], self.pad)
        metrics = role_metrics("rm", self.model.rm_update(batch))
        metrics["batch/sequences"] = float(batch["input_ids"].shape[0])
        return metrics, int(batch["attention_mask"].sum())

    def scores(self, pairs: list) -> tuple:
        """([P] chosen, [P] rejected) scores of `pairs` under the current model."""
        scores = self.model.compute_rm_score(pair_batch(pairs, self.pad))["rm_scores"].double()
        return scores[0::2], scores[1::2]

    def validate(self) -> dict[str, float]:
        """The loss and ranking metrics over data.val_files, under `val/rm/`."""
        chosen, rejected = self.scores(self.val_examples)
        losses, metrics = bradley_terry_loss(chosen, rejected)
        out = {f"val/rm/{k}": float(v.mean()) for k, v in metrics.items()}
        out["val/rm/loss"] = float(losses.mean())
        return out


def train_reward_model(cfg: MegarlConfig, stream: TextIO | None = None) -> Path:
    """Train the reward model `cfg` describes (resumed per trainer.resume), stop its workers, and return
    the exported Hugging Face sequence classifier (`<trainer.output_dir>/hf`), ready for
    `reward.model_path`. Metrics are in `<output_dir>/metrics.jsonl` and `summary.json`."""
    with RewardModelTrainer(cfg, stream) as trainer:
        return trainer.fit()
