"""ActorWorker: the trained policy, with its colocated rollout engine (on megatron-core; the FSDP twin
is megarl.workers.fsdp_roles.FSDPActorWorker, the same logic in `ActorRole`).

    log_prob(batch)      -> Batch(old_log_probs [n, R], entropy [n, R])
    update(batch)        -> metrics dict (PPO epochs × mini-batches × micro-batches, one optimizer step
                            per mini-batch)
    generate(prompts)    -> rollout Batch (responses, rollout_log_probs, …), GEN_DP_COMPUTE: the
                            3D-HybridEngine syncs the weights into the colocated vLLM engine first
    sft_update(batch)    -> metrics dict: one optimizer step on the response tokens' NLL (SFT)
    preference_update(batch, settings, counts, weight=1.0)
                         -> metrics dict: one optimizer step on weight × a preference loss (DPO, IPO,
                            KTO, ORPO, SimPO; megarl.workers.preference_loss)
    export_hf(out_dir)   -> the Hugging Face checkpoint written from the live weights (any layout)
    join_bridge(host, port, n_engine_ranks, engine_tp), send_weights(version)
                         -> the weight sync to a separate rollout pool (megarl.workers.rollout_worker):
                            each rank sends its own shards' planned slices (megarl.hybrid.pool_sync)

Built from `role_spec(cfg, "actor")`: its layout, batching, offload, optimizer, loss settings
(`spec.algorithm`), mini-batch size and rollout engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from megarl.algorithms.aggregate import aggregate
from megarl.algorithms.estimator_traits import ESTIMATOR_TRAITS
from megarl.algorithms.preference_terms import BatchCounts, PreferenceSettings
from megarl.config.roles import RoleSpec, RolloutSpec
from megarl.config.schema import AlgorithmConfig
from megarl.controller.dispatch import Dispatch, register
from megarl.models.forward import vocab_parallel_entropy
from megarl.protocol import Batch, Col
from megarl.workers.actor_loss import policy_objective
from megarl.workers.log_probs import response_log_probs, token_log_probs
from megarl.workers.megatron_worker import MegatronWorker
from megarl.workers.model_worker import ModelWorker
from megarl.workers.routes import LIVE_ROUTES
from megarl.workers.sequences import sequences_from_batch
from megarl.workers.train_loop import GlobalCounts, train_minibatches

if TYPE_CHECKING:
    from megarl.hybrid.engine import HybridEngine
    from megarl.hybrid.pool_sync import PoolSender


class ActorRole(ModelWorker):
    """The actor's logic on either backend (the backend class comes after it in the bases)."""

    def __init__(self, spec: RoleSpec) -> None:
        if not spec.trainable or spec.algorithm is None or spec.rollout is None:
            raise ValueError(f"the actor needs a trained role's spec with a rollout; got {spec.role!r}")
        self.algorithm: AlgorithmConfig = spec.algorithm  # the checks above: both are set
        self.rollout_spec: RolloutSpec = spec.rollout
        super().__init__(spec)
        self.hybrid: HybridEngine | None = None  # the rollout engine, started by the first generate()
        self._generator: torch.Generator | None = None  # clip_cov's token pick
        self._sampling_step = 0  # the rollout's sampling counter from a checkpoint, for a later engine
        self.pool_sender: PoolSender | None = None  # the weight sync to a separate rollout pool

    @register(Dispatch.DP_COMPUTE)
    def log_prob(self, batch: Batch) -> Batch:
        """The current policy's log-prob and entropy of every response token (0 on padding), and Σπ² when
        the advantage estimator needs it (the optimal token baseline)."""
        assert self.algorithm.adv_estimator is not None  # a role spec is built from the resolved config
        needs_pi2 = ESTIMATOR_TRAITS[self.algorithm.adv_estimator].needs_sum_pi_squared
        stats = (Col.ENTROPY, Col.SUM_PI_SQUARED) if needs_pi2 else (Col.ENTROPY,)
        # MoE routing replay: R2 records the routes the update replays; R3 replays the engine's and
        # records what the routers would have chosen (the trainer's disagreement with the engine)
        replay = self.spec.router_replay
        routes_to = {"R2": Col.ROUTED_EXPERTS, "R3": LIVE_ROUTES}.get(replay)
        return response_log_probs(self, batch, Col.OLD_LOG_PROBS, stats, routes_to)

    @register(Dispatch.GEN_DP_COMPUTE)
    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        """Sample responses for this generation replica's share of `prompts` (rollout.* sampling, or
        rollout.val.* when `validate`) with the current weights."""
        from megarl.hybrid.engine import HybridEngine

        self.check_loaded()
        if self.hybrid is None:
            tp_groups, source = self.generation_source(self.rollout_spec.rollout)
            self.hybrid = HybridEngine(
                source,
                tp_groups,
                self.rollout_spec,
                offload=lambda: self.offload(params=False),
                reload=self.reload,
            )
            self.hybrid.rollout.sampling_step = self._sampling_step
        return self.hybrid.generate(prompts, validate)

    @register(Dispatch.ONE_TO_ALL)
    def join_bridge(self, host: str, port: int, n_engine_ranks: int, engine_tp: int) -> dict:
        """Join the weight bridge to a separate rollout pool of `n_engine_ranks` ranks in TP groups of
        `engine_tp` (collective with the pool's join_bridge; the store is served by this group's rank 0
        at host:port). Megatron actors only."""
        from megarl.hybrid.pool_sync import PoolSender

        if self.pool_sender is not None:
            self.pool_sender.close()
            self.pool_sender = None
        self.pool_sender = PoolSender.join(self, host, port, n_engine_ranks, engine_tp)
        table = self.pool_sender.table
        return {"rank": self.env.rank, "tensors": len(table.params), "buckets": len(table.buckets)}

    @register(Dispatch.ONE_TO_ALL)
    def send_weights(self, version: int) -> dict:
        """Send the current weights to the rollout pool as `version` (collective with the pool's
        receive_weights(version)); returns this rank's report (bytes sent, buckets, seconds)."""
        from megarl.hybrid.pool_sync import PoolSyncError

        if self.pool_sender is None:
            raise PoolSyncError("send_weights before join_bridge: call join_bridge on both pools first")
        self.check_loaded()
        return self.pool_sender.send(version).report()

    def shutdown(self) -> None:
        if self.hybrid is not None:  # vLLM's groups go before megatron's
            self.hybrid.close()
            self.hybrid = None
        if self.pool_sender is not None:
            self.pool_sender.close()
            self.pool_sender = None
        super().shutdown()

    @register(Dispatch.DP_COMPUTE)
    def update(self, batch: Batch) -> dict[str, float]:
        """PPO-style policy update on a batch with old_log_probs and advantages (and ref_log_probs when
        algorithm.use_kl_loss). Returns metrics averaged over the optimizer steps."""
        fused = self.algorithm.old_log_prob == "fused"  # the old log-probs are this forward's
        needed = ([] if fused else [Col.OLD_LOG_PROBS]) + [Col.ADVANTAGES]
        needed += [Col.REF_LOG_PROBS] if self.algorithm.use_kl_loss else []
        missing = [k for k in needed if k not in batch.tensors.keys()]
        if missing:
            raise KeyError(f"policy update needs columns {missing} in the batch")
        # fused: the engine's log-probs, when the batch has them, give the train/rollout mismatch metrics
        optional = [Col.ROLLOUT_IS_WEIGHTS] + ([Col.ROLLOUT_LOG_PROBS] if fused else [])
        optional = [k for k in optional if k in batch.tensors.keys()]
        seqs = sequences_from_batch(batch)
        fields = {k: batch[k].float() for k in needed + optional}
        mini = self.spec.mini_batch_size // self.layout.dp
        return train_minibatches(self, seqs, fields, self._policy_loss, mini, self.spec.epochs)

    def _policy_loss(self, mb: dict, logits: torch.Tensor, counts: GlobalCounts):
        algo = self.algorithm
        log_probs, selected = token_log_probs(mb, logits, self.arch.vocab_size, self.spec.temperature)
        fused = algo.old_log_prob == "fused"  # the old log-probs are this forward's, detached
        old = log_probs.detach() if fused else mb[Col.OLD_LOG_PROBS]
        loss, out = policy_objective(
            algo,
            log_probs,
            old,
            mb,
            counts,
            entropy=lambda: vocab_parallel_entropy(selected, self.arch.vocab_size),
            # clip_cov's random token pick, reproducible per rank and call
            generator=self._loss_generator() if algo.policy_loss == "clip_cov" else None,
        )
        if fused:
            out.update(self._old_log_prob_metrics(mb, old, selected, mb["mask"], counts))
        return loss, out

    def _old_log_prob_metrics(self, mb, old, selected, mask, counts: GlobalCounts) -> dict[str, torch.Tensor]:
        """What the old_log_prob stage logs, from the update's forward: the mean entropy and, when the batch
        has the engine's log-probs, the mean and max |train − rollout| log-prob over the mini-batch's
        tokens (means weighted to sum over micro-batches; `_max` keys are max-reduced)."""
        with torch.no_grad():
            real = mask > 0
            # over the real tokens only: [T, V/tp] rather than the padded [k, R, V/tp], beside the graph
            entropy = vocab_parallel_entropy(selected.detach()[real], self.arch.vocab_size)
            out = {"actor/entropy": entropy.sum() / counts.num_tokens}
            if Col.ROLLOUT_LOG_PROBS in mb:
                diff = (old - mb[Col.ROLLOUT_LOG_PROBS]).abs()
                out["actor/train_rollout_logprob_abs_diff"] = aggregate(
                    diff, mask, "token-mean", num_tokens=counts.num_tokens
                )
                out["actor/train_rollout_logprob_abs_diff_max"] = (
                    diff[real].max() if real.any() else diff.new_zeros(())
                )
            return out

    def _loss_generator(self) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.rollout_spec.seed * 7919 + self.env.rank)
        return self._generator

    def _extra_state(self) -> dict:
        """The rollout's sampling counter (per-request seeds derive from it) and clip_cov's generator."""
        step = self.hybrid.rollout.sampling_step if self.hybrid is not None else self._sampling_step
        state: dict = {"sampling_step": step}
        if self._generator is not None:
            state["clip_cov_generator"] = self._generator.get_state()
        return state

    def _load_extra_state(self, state: dict) -> None:
        self._sampling_step = int(state.get("sampling_step", 0))
        if self.hybrid is not None:
            self.hybrid.rollout.sampling_step = self._sampling_step
        generator = state.get("clip_cov_generator")
        if generator is not None:
            self._generator = torch.Generator()
            self._generator.set_state(generator)

    @register(Dispatch.DP_COMPUTE)
    def sft_update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on the mean negative log-likelihood of the response tokens of `batch`
        (token-mean over the whole batch, every DP rank and micro-batch)."""
        seqs = sequences_from_batch(batch)
        return train_minibatches(self, seqs, {}, self._nll_loss, len(seqs), epochs=1)

    def _nll_loss(self, mb: dict, logits: torch.Tensor, counts: GlobalCounts):
        log_probs, _ = token_log_probs(mb, logits, self.arch.vocab_size)
        loss = aggregate(-log_probs, mb["mask"], "token-mean", num_tokens=counts.num_tokens)
        return loss, {}

    @register(Dispatch.DP_COMPUTE)
    def preference_update(
        self, batch: Batch, settings: PreferenceSettings, counts: BatchCounts, weight: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step on `weight` × the preference loss of `batch`: pairs as interleaved rows
        (chosen, rejected, …) for the paired losses, examples with a `desirable` column for KTO;
        `ref_logps` (sequence sums, at the reference's temperature, which is this role's) when the loss
        uses the reference. `counts` are the whole batch's. Metrics: `loss` (weighted, what was
        backpropagated), `unweighted_loss`, the loss's terms, grad_norm, lr."""
        from megarl.workers.preference_loss import preference_loss_fn

        seqs = sequences_from_batch(batch)
        fields = {k: batch[k] for k in batch.tensors.keys() if k in ("ref_logps", "desirable")}
        loss_fn = preference_loss_fn(settings, counts, self.arch.vocab_size, weight, self.spec.temperature)
        group = 2 if settings.paired else 1
        return train_minibatches(self, seqs, fields, loss_fn, len(seqs), epochs=1, group=group)

    @register(Dispatch.DP_COMPUTE)
    def ref_log_prob(self, batch: Batch) -> Batch:
        """The reference policy's log-prob of every response token (0 on padding): the frozen base, i.e.
        this model with its LoRA adapters disabled (bitwise the base model's): with LoRA the actor is the
        reference, and no second copy of the model is built."""
        from megarl.models.lora.apply import adapters_disabled

        if self.spec.lora is None:  # (megarl's FSDP backend has no LoRA)
            raise ValueError(
                "the actor is the reference only with LoRA (actor.lora.rank > 0, megatron backend)"
            )
        with adapters_disabled(self.chunks):
            return response_log_probs(self, batch, Col.REF_LOG_PROBS)

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> str:
        """Write the current weights as a Hugging Face checkpoint at `out_dir` (collective); returns it."""
        return self.write_hf(out_dir)


class ActorWorker(ActorRole, MegatronWorker):
    """The actor on megatron-core. With LoRA (`actor.lora`) it is also the reference (`ref_log_prob`)."""
