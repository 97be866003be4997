"""HybridEngine: the actor's colocated rollout engine and the transitions around each generation.

    generate(prompts):
      1. offload the optimizer state / gradients (actor.offload_optimizer / offload_grads)
      2. wake the engine's weights (GPU), reshard the training shards into the generation layout and
         push them into the engine bucket by bucket, wake its KV cache
      3. generate this generation replica's prompts
      4. put the engine to sleep (GPU: frees weights and KV cache), reload the training state

The engine's TP groups are the backend's plan (Megatron: strided inside each training TP group; FSDP:
runs of consecutive ranks), so the weight source moves only the bytes of the plan's floor. One
HybridEngine per actor rank; every rank of the training world takes part in every call (the sync is
collective). Its collaborators are given explicitly: the weight source (anything with
`buckets(stats)` yielding this rank's HF tensors: megarl.hybrid.reshard.Resharder for megatron shards,
megarl.fsdp.weight_sync for FSDP ones; with LoRA megarl.hybrid.lora_sync.LoraWeightSync, which pushes
the adapters itself), the generation TP groups, the rollout spec, and the
offload/reload callables that set the training state aside (each returns its report dicts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Protocol

from megarl.hybrid.lora_sync import LoraWeightSync
from megarl.hybrid.reshard import HFBucket, ReshardStats
from megarl.protocol import Batch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from megarl.config.roles import RolloutSpec


class WeightSource(Protocol):
    """What streams this rank's share of the current weights into its engine, counting what it moves."""

    def buckets(self, stats: ReshardStats) -> Iterator[HFBucket]: ...


class HybridEngine:
    def __init__(
        self,
        source: WeightSource,
        tp_groups: list[list[int]],
        rollout: RolloutSpec,
        offload: Callable[[], list[dict]],
        reload: Callable[[], list[dict]],
    ) -> None:
        from megarl.rollout.vllm import VLLMRollout

        r = rollout.rollout
        self.sampling = r  # training rollouts; r.val for validation
        self.offload, self.reload = offload, reload
        self.source, self.tp_groups = source, tp_groups
        self.rollout = VLLMRollout(rollout, tp_groups=tp_groups)
        self.rollout.sleep()  # frees device memory for training; a no-op on CPU
        self.last_stats: ReshardStats | None = None  # this rank's numbers of the latest sync

    def sync_weights(self) -> ReshardStats:
        """Reshard the current training weights into the engine (collective over the world)."""
        stats = ReshardStats()
        self.rollout.wake_up(["weights"])
        if isinstance(self.source, LoraWeightSync):  # the actor trains LoRA: adapters, or merged weights
            start = time.perf_counter()
            self.source.sync(self.rollout, stats)
            stats.seconds["engine_load"] = time.perf_counter() - start - sum(stats.seconds.values())
        else:
            for bucket in self.source.buckets(stats):
                start = time.perf_counter()
                stats.engine_loader = self.rollout.load_weights(bucket)
                stats.seconds["engine_load"] = (
                    stats.seconds.get("engine_load", 0.0) + time.perf_counter() - start
                )
        self.rollout.wake_up(["kv_cache"])
        self.last_stats = stats
        return stats

    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        """Responses for this generation replica's prompts, with the training state set aside meanwhile."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        offloads = self.offload()
        timings["offload"] = time.perf_counter() - start
        start = time.perf_counter()
        stats = self.sync_weights()
        timings["sync"] = time.perf_counter() - start
        start = time.perf_counter()
        # with the engine's log-probs unless rollout.calculate_log_probs=false (the generate stage's columns)
        log_probs = self.rollout.has_log_probs
        out = self.rollout.generate(prompts, self.sampling.val if validate else self.sampling, log_probs)
        timings["generate"] = time.perf_counter() - start
        start = time.perf_counter()
        self.rollout.sleep()
        reloads = self.reload()
        timings["reload"] = time.perf_counter() - start
        out.meta["hybrid_engine"] = {
            "reshard": {**asdict(stats), "ratio": stats.ratio},
            "seconds": timings,
            "offloaded": offloads,
            "reloaded": reloads,
        }
        return out

    def close(self) -> None:
        self.rollout.close()
