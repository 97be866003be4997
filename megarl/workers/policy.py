"""PolicyWorker: the actor (trainable) and the frozen reference policy, on megatron-core.

    log_prob(batch)      -> Batch(old_log_probs [n, R], entropy [n, R])   actor
    ref_log_prob(batch)  -> Batch(ref_log_prob [n, R])                    reference
    update(batch)        -> metrics dict (PPO epochs × mini-batches × micro-batches, one optimizer step
                            per mini-batch)                                actor
    generate(prompts)    -> rollout Batch (responses, rollout_log_probs, …) actor, GEN_DP_COMPUTE: the
                            3D-HybridEngine syncs the weights into the colocated vLLM engine first

Log-probs and entropy are computed vocabulary-parallel (each TP rank keeps its slice of the logits;
only per-token scalars are all-reduced) on the last pipeline stage, then broadcast over PP. The two roles
are colocatable: `RayWorkerGroup.colocated(pool, {"actor": ..., "ref": ...})` puts both in one process
per rank, sharing the actor's layout.
"""

from __future__ import annotations

import torch

from megarl.algorithms.aggregate import aggregate
from megarl.algorithms.kl import kl_penalty
from megarl.algorithms.policy_loss import POLICY_LOSSES, entropy_bonus
from megarl.config.schema import MegarlConfig
from megarl.controller.dispatch import Dispatch, register
from megarl.models.forward import select_positions, vocab_parallel_entropy, vocab_parallel_log_probs
from megarl.protocol import Batch
from megarl.workers.megatron_worker import GlobalCounts, MegatronWorker
from megarl.workers.sequences import sequences_from_batch


class PolicyWorker(MegatronWorker):
    def __init__(self, cfg: MegarlConfig, role: str = "actor", total_steps: int | None = None) -> None:
        if role not in ("actor", "ref"):
            raise ValueError(f"PolicyWorker plays 'actor' or 'ref', not {role!r}")
        super().__init__(cfg, role, trainable=role == "actor", total_steps=total_steps)
        self.hybrid = None  # the rollout engine, started by the first generate()

    def _token_log_probs(self, mb: dict, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p of each response token, the vocab-parallel logits at those positions) — [k, R], [k, R, V/tp]."""
        selected = select_positions(logits, mb["index"])
        labels = mb["labels"].reshape(-1)[mb["index"].reshape(-1)].reshape(mb["index"].shape)
        return vocab_parallel_log_probs(selected, labels, self.arch.vocab_size) * mb["mask"], selected

    def _require(self, role: str, method: str) -> None:
        if self.role != role:
            raise RuntimeError(f"{method} is a method of the {role!r} role; this worker is {self.role!r}")

    @register(Dispatch.DP_COMPUTE)
    def log_prob(self, batch: Batch) -> Batch:
        """The current policy's log-prob and entropy of every response token (0 on padding)."""
        self._require("actor", "log_prob")
        return self._log_probs(batch, "old_log_probs", with_entropy=True)

    @register(Dispatch.DP_COMPUTE)
    def ref_log_prob(self, batch: Batch) -> Batch:
        """The reference policy's log-prob of every response token (0 on padding)."""
        self._require("ref", "ref_log_prob")
        return self._log_probs(batch, "ref_log_prob", with_entropy=False)

    def _log_probs(self, batch: Batch, name: str, with_entropy: bool) -> Batch:
        seqs = sequences_from_batch(batch)
        width = seqs.response_width

        def compute(mb, logits):
            log_probs, selected = self._token_log_probs(mb, logits)
            out = {name: log_probs}
            if with_entropy:
                out["entropy"] = vocab_parallel_entropy(selected, self.arch.vocab_size) * mb["mask"]
            return out

        shapes = {name: (width,), **({"entropy": (width,)} if with_entropy else {})}
        return Batch(tensors=self.forward_rows(seqs, compute, shapes))

    @register(Dispatch.GEN_DP_COMPUTE)
    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        """Sample responses for this generation replica's share of `prompts` (rollout.* sampling, or
        rollout.val.* when `validate`) with the current weights."""
        from megarl.hybrid.engine import HybridEngine

        self._require("actor", "generate")
        self._check_loaded()
        if self.hybrid is None:
            self.hybrid = HybridEngine(self)
        return self.hybrid.generate(prompts, validate)

    def shutdown(self) -> None:
        if self.hybrid is not None:  # vLLM's groups go before megatron's
            self.hybrid.close()
            self.hybrid = None
        super().shutdown()

    @register(Dispatch.DP_COMPUTE)
    def update(self, batch: Batch) -> dict[str, float]:
        """PPO-style policy update on a batch with old_log_probs and advantages (and ref_log_prob when
        algorithm.use_kl_loss). Returns metrics averaged over the optimizer steps."""
        self._require("actor", "update")
        algo = self.cfg.algorithm
        needed = ["old_log_probs", "advantages"] + (["ref_log_prob"] if algo.use_kl_loss else [])
        missing = [k for k in needed if k not in batch.tensors.keys()]
        if missing:
            raise KeyError(f"policy update needs columns {missing} in the batch")
        seqs = sequences_from_batch(batch)
        fields = {k: batch[k].float() for k in needed}
        mini = algo.ppo_mini_batch_size * self.cfg.rollout.n // self.layout.dp
        return self.train_minibatches(seqs, fields, self._policy_loss, mini, algo.ppo_epochs)

    def _policy_loss(self, mb: dict, logits: torch.Tensor, counts: GlobalCounts):
        algo = self.cfg.algorithm
        mask = mb["mask"]
        agg = {"agg_mode": algo.loss_agg_mode, **counts.agg()}
        log_probs, selected = self._token_log_probs(mb, logits)
        loss, metrics = POLICY_LOSSES[algo.policy_loss](
            log_probs,
            mb["old_log_probs"],
            mb["advantages"],
            mask,
            algo.clip_ratio_low,
            algo.clip_ratio_high,
            clip_ratio_c=algo.clip_ratio_c,
            **agg,
        )
        # Metrics are token means over this micro-batch; weight them by its share of the mini-batch tokens.
        share = mask.sum() / counts.num_tokens
        out = {f"actor/{k}": torch.as_tensor(v, dtype=torch.float64) * share for k, v in metrics.items()}
        out["actor/pg_loss"] = loss.detach()
        if algo.entropy_coeff:
            entropy = vocab_parallel_entropy(selected, self.arch.vocab_size)
            loss = loss - entropy_bonus(entropy, mask, algo.entropy_coeff, **agg)
            out["actor/entropy"] = aggregate(
                entropy.detach(), mask, "token-mean", num_tokens=counts.num_tokens
            )
        if algo.use_kl_loss:
            kl = kl_penalty(log_probs, mb["ref_log_prob"], algo.kl_estimator)
            kl = aggregate(kl, mask, algo.loss_agg_mode, **counts.agg())
            loss = loss + algo.kl_coef * kl
            out["actor/kl_loss"] = kl.detach()
        return loss, out
