"""Offline preference training on Megatron: DPO, IPO, KTO, ORPO and SimPO with the actor's workers and
layouts, the loop SFT uses (megarl.trainer.offline): data, logging, validation and Hugging Face export.

    megarl dpo configs/quickstart_preference.yaml data.train_files=[pairs.parquet]
    megarl kto configs/quickstart_preference.yaml data.train_files=[kto.parquet]
    with DPOTrainer(cfg) as t: t.fit()   # … KTOTrainer, ORPOTrainer, SimPOTrainer, IPOTrainer

Each step is one optimizer step on `data.train_batch_size` pairs (KTO: examples); the loss is the mean
over them, whatever the TP/PP/DP layout and micro-batching (a micro-batch holds whole pairs). The
reference (dpo, ipo, kto) runs in the actor's processes and scores each batch, or with
`preference.precompute_ref=true` scores the whole data set once before training and is then offloaded.
KTO's reference point z0 comes from mismatched (prompt, completion) pairs: each example's prompt with
another example's completion (fixed per run, `megarl.data.preference.kl_partners`), scored by the policy
(no gradient) and the reference.

Validation (data.val_files, at step 0, every trainer.eval_every steps and after the last) logs the
same metrics under `val/`; KTO evaluates pair files (prompt/chosen/rejected) with its implied reward
β·log(π/π_ref), or KTO files with its own loss. The model is written to `<output_dir>/hf` at the end.
"""

from __future__ import annotations

import copy
from typing import TextIO, cast

import torch

from megarl.algorithms import preference as pref
from megarl.algorithms.preference_terms import (
    BatchCounts,
    PreferenceSettings,
    interleaved_pair_terms,
    kto_terms,
)
from megarl.config.options import AlgorithmName
from megarl.config.schema import MegarlConfig
from megarl.config.validate import resolve_auto, validate
from megarl.config.validate_algorithm import PREFERENCE_ALGORITHMS, REFERENCE_ALGORITHMS
from megarl.data import preference as data
from megarl.data.files import DataError, read_rows
from megarl.protocol import Batch
from megarl.trainer.offline import OfflineTrainer
from megarl.trainer.rl_stages import role_metrics
from megarl.workers.groups import RefGroup


def preference_config(cfg: MegarlConfig, name: str | None = None) -> MegarlConfig:
    """`cfg` for preference training with algorithm `name` (default: cfg.algorithm.name): the actor and,
    for dpo/ipo/kto, the reference; no critic, reward model or rollout sampling."""
    cfg = copy.deepcopy(cfg)
    cfg.algorithm.name = cast(AlgorithmName, name or cfg.algorithm.name)  # checked on the next line
    if cfg.algorithm.name not in PREFERENCE_ALGORITHMS:
        raise ValueError(
            f"algorithm.name={cfg.algorithm.name} is not a preference algorithm; use one of "
            f"{', '.join(PREFERENCE_ALGORITHMS)}"
        )
    cfg.critic.enable = cfg.reward.enable = False
    # the loss decides (a config resolved under another algorithm name may say otherwise)
    cfg.ref.enable = cfg.algorithm.name in REFERENCE_ALGORITHMS
    cfg.rollout.temperature = 1.0  # log-probs of the model itself, not of a sampler
    validate(cfg, check_paths=False)  # a config checked under another algorithm name may not fit this one
    return resolve_auto(cfg)


def _has_pairs(files: list[str], cfg: MegarlConfig, config_key: str) -> bool:
    """Whether the first row of `files` is a preference pair (else a KTO example)."""
    for raw in read_rows(files[0], config_key):
        return isinstance(raw.value, dict) and cfg.data.chosen_key in raw.value
    return False


class PreferenceTrainer(OfflineTrainer):
    algorithm: str | None = None  # set by DPOTrainer & co.; None = cfg.algorithm.name

    def __init__(self, cfg: MegarlConfig, stream: TextIO | None = None) -> None:
        cfg = preference_config(cfg, self.algorithm)
        self.settings = PreferenceSettings.from_config(cfg)
        self.job = cfg.algorithm.name
        self.items = "pairs" if self.settings.paired else "examples"
        self.ref_cache: dict[str, torch.Tensor] = {}
        self.kl_partners: dict[str, list[int]] = {}
        super().__init__(cfg, stream)

    def load(self, files: list[str], config_key: str) -> list:
        return self._load(files, config_key, self.settings.paired)

    def load_val(self, files: list[str], config_key: str) -> list:
        return self._load(files, config_key, self.settings.paired or _has_pairs(files, self.cfg, config_key))

    def _load(self, files: list[str], config_key: str, paired: bool) -> list:
        if paired:
            return data.load_preference_pairs(files, self.tokenizer, self.cfg.data, config_key)
        examples = data.load_kto_examples(files, self.tokenizer, self.cfg.data, config_key)
        if len(examples) < 2:
            raise DataError(
                f"{config_key}: KTO needs at least 2 usable examples (its KL pairs mismatch them)"
            )
        return examples

    def _partners(self, split: str) -> list[int]:
        """KTO's KL partners of the `split` examples, fixed for the run (data.seed)."""
        if split not in self.kl_partners:
            examples = self.examples if split == "train" else self.val_examples
            self.kl_partners[split] = data.kl_partners(examples, self.cfg.data.seed)
        return self.kl_partners[split]

    def before_training(self) -> None:
        if self.cfg.preference.precompute_ref and self.roles.ref is not None:
            self._precompute_reference(self.roles.ref)

    def train_step(self, indices: list[int]) -> tuple[dict[str, float], int]:
        items = [self.examples[i] for i in indices]
        extra: dict[str, float] = {}
        if self.settings.paired:
            batch = data.pair_batch(items, self.pad)
            counts = BatchCounts(len(items), chosen_tokens=sum(len(p.chosen_ids) for p in items))
        else:
            batch = data.kto_batch(items, self.pad)
            z0 = self._kto_ref_point(indices, "train")
            good = int(batch["desirable"].sum())
            counts = BatchCounts(len(items), desirable=good, undesirable=len(items) - good, ref_point=z0)
            extra["kto/kl"] = z0
        if self.settings.uses_reference:
            batch["ref_logps"] = self._reference(batch, indices, "train")
        metrics = role_metrics("actor", self.roles.actor.preference_update(batch, self.settings, counts))
        metrics["pref/loss"] = metrics.pop("actor/loss")
        del metrics["actor/unweighted_loss"]  # the same at weight 1
        metrics["batch/sequences"] = float(batch["input_ids"].shape[0])
        return {**metrics, **extra}, int(batch["attention_mask"].sum())

    # ---- reference and policy log-probs ----------------------------------------------------------------

    def _sequence_sums(self, group, batch: Batch, column: str, method: str) -> torch.Tensor:
        token_logps = getattr(group, method)(batch)[column]
        return (token_logps.double() * batch["response_mask"].double()).sum(-1)

    def _reference(self, batch: Batch, indices: list[int], split: str, kl: bool = False) -> torch.Tensor:
        """[rows] the reference's sequence log-prob sums of `batch` (the items at `indices` of `split`,
        their KL pairs when `kl`): from the precomputed cache, else a reference forward."""
        key = f"{split}/kl" if kl else split
        if key in self.ref_cache:
            rows = self.ref_cache[key][indices]
            return rows.reshape(-1)  # pairs: [P, 2] -> interleaved chosen, rejected
        return self._sequence_sums(self.roles.ref, batch, "ref_log_probs", "ref_log_prob")

    def _kto_ref_point(self, indices: list[int], split: str) -> float:
        """z0 of KTO for the examples at `indices`: their mismatched pairs under the policy and reference."""
        examples = self.examples if split == "train" else self.val_examples
        kl_batch = data.kto_kl_batch(examples, self.pad, indices, self._partners(split))
        policy = self._sequence_sums(self.roles.actor, kl_batch, "old_log_probs", "log_prob")
        ref = self._reference(kl_batch, indices, split, kl=True)
        return float(pref.kto_ref_point(policy, ref))

    def _precompute_reference(self, ref: RefGroup) -> None:
        """Every reference log-prob training and validation will need, in one pass; then the reference
        is offloaded."""
        splits = {"train": self.examples, "val": self.val_examples}
        with self.log.task("computing the reference log-probs of the whole data set"):
            for split, examples in splits.items():
                if not examples:
                    continue
                paired = isinstance(examples[0], data.PreferencePair)
                parts, kl_parts = [], []
                for start in range(0, len(examples), self.cfg.data.train_batch_size):
                    indices = list(range(start, min(start + self.cfg.data.train_batch_size, len(examples))))
                    items = [examples[i] for i in indices]
                    batch = data.pair_batch(items, self.pad) if paired else data.kto_batch(items, self.pad)
                    sums = self._sequence_sums(ref, batch, "ref_log_probs", "ref_log_prob")
                    parts.append(sums.reshape(-1, 2) if paired else sums)
                    if not paired:
                        kl_batch = data.kto_kl_batch(examples, self.pad, indices, self._partners(split))
                        kl_parts.append(self._sequence_sums(ref, kl_batch, "ref_log_probs", "ref_log_prob"))
                self.ref_cache[split] = torch.cat(parts)
                if kl_parts:
                    self.ref_cache[f"{split}/kl"] = torch.cat(kl_parts)
            ref.offload(params=True)

    # ---- validation ----------------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        """The loss and reward metrics over data.val_files, under `val/`."""
        examples = self.val_examples
        indices = list(range(len(examples)))
        if isinstance(examples[0], data.PreferencePair):
            return self._validate_pairs(examples, indices)
        return self._validate_kto(examples, indices)

    def _logps(self, batch: Batch) -> torch.Tensor:
        """[rows, R] the policy's token log-probs of `batch`."""
        return self.roles.actor.log_prob(batch)["old_log_probs"].double()

    def _validate_pairs(self, pairs: list, indices: list[int]) -> dict[str, float]:
        # KTO's implied reward on pairs is DPO's, β·log(π/π_ref)
        s = self.settings if self.settings.paired else PreferenceSettings("dpo", self.settings.beta)
        batch = data.pair_batch(pairs, self.pad)
        token_logps, mask = self._logps(batch), batch["response_mask"].double()
        ref = self._reference(batch, indices, "val").double() if s.uses_reference else None
        counts = BatchCounts(len(pairs), chosen_tokens=sum(len(p.chosen_ids) for p in pairs))
        losses, metrics = interleaved_pair_terms(s, token_logps, mask, ref, counts)
        out = {f"val/{k}": float(v.mean()) for k, v in metrics.items()}
        if self.settings.paired:
            out["val/pref/loss"] = float(losses.mean())
        return out

    def _validate_kto(self, examples: list, indices: list[int]) -> dict[str, float]:
        batch = data.kto_batch(examples, self.pad)
        logps = pref.sequence_logps(self._logps(batch), batch["response_mask"].double())
        ref = self._reference(batch, indices, "val").double()
        z0 = self._kto_ref_point(indices, "val")
        good = int(batch["desirable"].sum())
        counts = BatchCounts(len(examples), desirable=good, undesirable=len(examples) - good, ref_point=z0)
        losses, metrics = kto_terms(self.settings, logps, ref, batch["desirable"].bool(), counts)
        out = {f"val/{k}": float(v.mean()) for k, v in metrics.items()}
        out.update({"val/pref/loss": float(losses.mean()), "val/kto/kl": z0})
        return out


class DPOTrainer(PreferenceTrainer):
    algorithm = "dpo"


class IPOTrainer(PreferenceTrainer):
    algorithm = "ipo"


class KTOTrainer(PreferenceTrainer):
    algorithm = "kto"


class ORPOTrainer(PreferenceTrainer):
    algorithm = "orpo"


class SimPOTrainer(PreferenceTrainer):
    algorithm = "simpo"
