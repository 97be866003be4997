"""DPO inside the RL step: after the PPO update, one more optimizer step of the actor on a batch of
preference pairs, its loss scaled by a weight. A new RL variant made by re-wiring the step graph.

    from megarl.trainer.preference_stage import add_preference_update
    with RLTrainer(cfg) as trainer:           # dpo and ipo compare with the reference: ref.enable=true
        add_preference_update(trainer, ["pairs.parquet"], loss="dpo", beta=0.1, weight=0.5)
        history = trainer.fit()               # every step: actor/* (PPO) and preference/* metrics

Each step takes the next pairs of an epoch-cycling loader (`megarl.data.loader.PairLoader`; the files
are read, rendered and filtered as `megarl dpo` reads them: same formats, chat template and length
limits), scores them with the reference (dpo, ipo), and calls the actor's `preference_update` with the
loss multiplied by `weight`, so the gradient of that step is `weight` × the preference loss's (the
learning rate is the actor's, unchanged). The loss is the one offline preference training uses
(`megarl.workers.preference_loss`); log-probs are at rollout.temperature, the policy's and the
reference's alike, as the PPO update's are.

Metrics, under `preference/`: `loss` (the preference loss itself), `weighted_loss` (weight × loss: what
was backpropagated), `rewards/{chosen,rejected,margin,accuracy}`, `logps/{chosen,rejected}` (orpo:
`orpo/*`), `grad_norm`, `lr`, `bad_updates` (a non-finite preference update makes the step a bad step),
`epoch` (of the pairs).
The loader's position is saved with each checkpoint (`RLTrainer.trainer_state()["stages"]`) and
restored on resume, once the stage is added again before the first step.

The preference update is an optimizer step of its own, after the PPO one(s): both move the same Adam
moments, and Adam normalises each step's gradient, so `weight` sets the preference gradient's size
relative to the PPO gradients in those moments, not a fixed share of the parameter change;
actor.optimizer.clip_grad applies to the weighted gradient. It is also one more step of the actor's LR
schedule, which is sized by trainer.total_steps: a warm-up or decay ends sooner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megarl.algorithms import preference as pref
from megarl.algorithms.preference_terms import DEFAULT_BETA, PAIRED, BatchCounts, PreferenceSettings
from megarl.config.errors import ConfigError
from megarl.data.files import DataError
from megarl.data.loader import PairLoader
from megarl.data.preference import load_preference_pairs
from megarl.protocol import Batch
from megarl.trainer.dataflow import Stage, StepContext
from megarl.workers.groups import ActorGroup, RefGroup

if TYPE_CHECKING:
    from megarl.trainer.rl_trainer import RLTrainer

STAGE = "preference_update"
PREFIX = "preference/"


class PreferenceUpdate:
    """The preference_update stage's function: the next pairs, their reference log-probs, one weighted
    preference update of the actor. Keeps the loader's position (`state_dict`)."""

    def __init__(
        self,
        actor: ActorGroup,
        ref: RefGroup | None,
        pairs: PairLoader,
        settings: PreferenceSettings,
        weight: float,
    ) -> None:
        if not settings.paired:
            raise ValueError(
                f"loss={settings.name!r} trains on unpaired examples; the preference stage takes pairs: "
                f"use one of {', '.join(PAIRED)}"
            )
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight={weight} must be a positive number (it multiplies the preference loss)")
        if settings.uses_reference and ref is None:
            raise ValueError(f"loss={settings.name!r} compares the policy with the reference: it needs `ref`")
        self.actor, self.ref, self.pairs, self.settings, self.weight = actor, ref, pairs, settings, weight

    def __call__(self, ctx: StepContext, _rollouts: Batch) -> None:
        batch = self.pairs.next_batch()
        counts = BatchCounts(len(batch) // 2, chosen_tokens=int(batch["response_mask"][0::2].sum()))
        if self.ref is not None and self.settings.uses_reference:
            token_logps = self.ref.ref_log_prob(batch)["ref_log_probs"].double()
            batch["ref_logps"] = pref.sequence_logps(token_logps, batch["response_mask"].double())
        metrics = self.actor.preference_update(batch, self.settings, counts, self.weight)
        ctx.metrics.update(preference_metrics(metrics[0]))  # every DP replica returns the same
        ctx.metrics[f"{PREFIX}epoch"] = float(self.pairs.epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pairs.load_state_dict(state["pairs"])


def preference_metrics(worker: dict[str, float]) -> dict[str, float]:
    """The actor's preference_update metrics under `preference/` names: `loss` is the preference loss,
    `weighted_loss` what was backpropagated (weight × loss)."""
    out = {f"{PREFIX}{k}": float(v) for k, v in worker.items() if k not in ("loss", "unweighted_loss")}
    out[f"{PREFIX}loss"] = float(worker["unweighted_loss"])
    out[f"{PREFIX}weighted_loss"] = float(worker["loss"])
    return out


def preference_update_stage(
    actor: ActorGroup,
    ref: RefGroup | None,
    pairs: PairLoader,
    settings: PreferenceSettings,
    weight: float,
    name: str = STAGE,
) -> Stage:
    """A stage making one preference update of `actor` per step on the next batch of `pairs`, its loss
    × `weight` (> 0); `ref` scores the pairs for the losses that use the reference (dpo, ipo). It reads
    and writes no rollout column: place it with `flow.insert_after("update_actor", stage)`."""
    return Stage(name, PreferenceUpdate(actor, ref, pairs, settings, weight))


def add_preference_update(
    trainer: RLTrainer,
    pairs_files: str | Path | Sequence[str | Path],
    loss: str = "dpo",
    beta: float | None = None,
    weight: float = 0.5,
    batch_size: int | None = None,
    *,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
) -> Stage:
    """Make every step of `trainer` end with a preference update on pairs from `pairs_files` (parquet
    or jsonl rows of prompt/chosen/rejected, in any form `megarl dpo` reads, under the data.* keys and
    length limits of the trainer's config), after the PPO update; returns the stage it inserted.

    loss: "dpo" or "ipo" (these need the reference: ref.enable=true), "orpo" or "simpo".
    beta: the loss's β; None = its default (0.1; simpo 2.0).
    weight: > 0, multiplies the preference loss (and so its gradient) of each step.
    batch_size: pairs per step; None = data.train_batch_size. Rounded down to a multiple of the actor's
        data-parallel size and at most the usable pairs.
    label_smoothing (dpo, simpo), simpo_gamma (simpo): as preference.* in a `megarl dpo` config.

    Call it before the first step; on resume the stage gets its saved position back at the first step.
    """
    if loss not in PAIRED:
        raise ValueError(f"loss={loss!r}: the preference stage takes pairs; use one of {', '.join(PAIRED)}")
    settings = PreferenceSettings(
        loss, DEFAULT_BETA.get(loss, 0.1) if beta is None else beta, label_smoothing, simpo_gamma
    )
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: pairs per step must be at least 1")
    if not settings.beta > 0:
        raise ValueError(f"beta={settings.beta} must be positive")
    if settings.uses_reference and trainer.roles.ref is None:
        raise ConfigError(
            [
                f"add_preference_update(loss={loss!r}) compares the policy with the reference model, but this "
                "run has none: set ref.enable=true in the config the trainer is built from (auto turns it on "
                "only for a KL term), or use loss='orpo' or 'simpo', which need no reference"
            ]
        )
    cfg = trainer.cfg
    files = [str(pairs_files)] if isinstance(pairs_files, str | Path) else [str(f) for f in pairs_files]
    pairs = load_preference_pairs(files, trainer.tokenizer, cfg.data, "add_preference_update(pairs_files)")
    dp = cfg.layout("actor").dp  # a pair's two rows must reach the same rank
    size = min(batch_size or cfg.data.train_batch_size, len(pairs)) // dp * dp
    if size < 1:
        raise DataError(
            f"add_preference_update: {len(pairs)} usable pair(s) in {', '.join(files)}, fewer than the actor's "
            f"{dp} data-parallel ranks; add pairs"
        )
    loader = PairLoader(pairs, size, cfg.data.seed, trainer.tokenizer.pad_token_id)
    stage = preference_update_stage(trainer.roles.actor, trainer.roles.ref, loader, settings, weight)
    trainer.flow.insert_after("update_actor", stage)
    trainer.flow.connect("update_actor", stage.name)  # stays after the PPO update whatever is added later
    return stage
