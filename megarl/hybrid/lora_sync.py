"""The actor's LoRA adapters into the generation layout: each engine rank gets its own shard only.

An adapter is small (2·r·(in + out) per projection), so it moves each step while the base weights move
once. Per adapter tensor, in one global order all ranks share (`megarl.models.lora.targets`):
  1. PP broadcast     from the stage whose layers hold it;
  2. gather           B of a column projection and A of a row projection are TP-sharded: the plan's
                      gather group (s = t/t_g consecutive TP ranks) assembles the generation shard;
                      a replicated tensor (A of a column projection, B of a row one) is already whole
                      on every rank and moves no bytes;
  3. PEFT tensors     written into full-shaped PEFT tensors at the region this rank's engine TP shard
                      reads (vLLM's LoRA layers slice B by output rows of column-parallel layers and A
                      by input columns of row-parallel ones); the rest is never written, never sent.
The bytes each rank receives are counted against the plan's floor for the same tensors (ratio 1.00).

The fallback (actor.lora.sync "merged") pushes the targeted base weights with their adapters folded in
(`merge.merged_weight` of each of `lora_linears_by_name`) through the base resharder.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from megarl.distributed.backend import collective_timeout
from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.param_kind import ParamKind
from megarl.distributed.platform import platform
from megarl.distributed.pool_plan import shard_dim
from megarl.hybrid.reshard import ReshardStats, _place
from megarl.models.convert.loader import global_named_parameters
from megarl.models.from_hf import ModelArchitecture
from megarl.models.lora.apply import lora_params
from megarl.models.lora.layers import lora_linears
from megarl.models.lora.merge import merged_weight
from megarl.models.lora.targets import LoraTensor, lora_tensors


def _local_shape(t: LoraTensor, tp: int) -> tuple[int, ...]:
    if t.kind is ParamKind.COLUMN:
        return (t.shape[0] // tp, t.shape[1])
    if t.kind is ParamKind.ROW:
        return (t.shape[0], t.shape[1] // tp)
    return t.shape


class AdapterResharder:
    """Built once per actor (collective: every rank of the training world constructs it)."""

    def __init__(
        self, chunks: list[torch.nn.Module], arch: ModelArchitecture, cfg: Any, plan: GenerationPlan
    ):
        from megatron.core import parallel_state as ps

        self.plan, self.rank = plan, dist.get_rank()
        self.coords = plan.layout.coordinates(self.rank)
        self.local = lora_params(chunks)
        self.tensors = lora_tensors(arch, cfg)
        held: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(held, (self.coords.pp, sorted(self.local)))
        self.owners: dict[str, set[int]] = {}
        for stage, names in held:
            for name in names:
                self.owners.setdefault(name, set()).add(stage)
        missing = [t.megatron for t in self.tensors if t.megatron not in self.owners]
        if missing:
            raise KeyError(
                f"no rank holds the adapter tensors {missing[:3]}…; the model and the LoRA settings disagree"
            )
        self.dtype = next(iter(self.local.values())).dtype if self.local else torch.float32
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.pp_ranks = plan.layout.pp_group_ranks(self.rank)
        self.gather_group = None
        for ranks in plan.gather_groups:  # every rank creates every group, in the same order
            group = dist.new_group(ranks, timeout=collective_timeout()) if len(ranks) > 1 else None
            if self.rank in ranks:
                self.gather_group = group

    def tensors_for_engine(self, stats: ReshardStats) -> dict[str, torch.Tensor]:
        """{PEFT name: full-shaped tensor holding this rank's engine region} of every adapter tensor."""
        out = {}
        tp, s = self.plan.layout.tp, self.plan.stride
        for t in self.tensors:
            start = time.perf_counter()
            owners = sorted(self.owners[t.megatron])
            stats.floor_bytes += self.plan.received_bytes(
                self.rank, math.prod(t.shape) * self.dtype.itemsize, t.kind, owners
            )
            if self.coords.pp in owners:
                shard = self.local[t.megatron].detach().contiguous()
            else:
                shard = torch.empty(_local_shape(t, tp), dtype=self.dtype, device=platform().device)
            if len(owners) < self.plan.layout.pp:
                dist.broadcast(shard, src=self.pp_ranks[owners[0]], group=self.pp_group)
                if self.coords.pp not in owners:
                    stats.received_bytes += shard.numel() * shard.element_size()
            stats.seconds["pp_broadcast"] += time.perf_counter() - start
            start = time.perf_counter()
            if t.kind.tp_sharded:
                dim = shard_dim(t.kind)
                assert dim is not None
                pieces = [shard]
                if s > 1:
                    pieces = [torch.empty_like(shard) for _ in range(s)]
                    dist.all_gather(pieces, shard, group=self.gather_group)
                    stats.received_bytes += (s - 1) * shard.numel() * shard.element_size()
                stats.seconds["gather"] += time.perf_counter() - start
                start = time.perf_counter()
                out[t.peft] = _place(torch.cat(pieces, dim=dim), self.coords.tp // s, tp // s, dim)
            else:
                out[t.peft] = shard
            stats.seconds["to_hf"] += time.perf_counter() - start
            stats.tensors += 1
        stats.buckets = 1
        stats.largest_bucket_bytes = sum(v.numel() * v.element_size() for v in out.values())
        return out


def lora_linears_by_name(chunks: list[torch.nn.Module]) -> dict[str, torch.nn.Module]:
    """{global megatron name of its weight: linear} of every linear carrying adapters."""
    names = {id(p): n for chunk in chunks for n, p in global_named_parameters(chunk)}
    return {names[id(linear.weight)]: linear for linear in lora_linears(chunks)}


class LoraWeightSync:
    """What the HybridEngine pushes into its engine at each sync when the actor trains LoRA.

    "adapter": the base weights once (the first sync: they are frozen), then only the adapters, each
    engine rank its own region (`AdapterResharder`), installed from memory (`VLLMRollout.load_adapter`).
    "merged": W + (alpha/r)·B·A of every targeted linear through the base resharder — every tensor at the
    first sync, only the targeted linears after. `check` compares checksums of what the engine holds
    with the trainer's adapter regions after each adapter sync (actor.lora.check_sync)."""

    def __init__(
        self,
        chunks,
        base,
        adapters: AdapterResharder,
        mode: str,
        peft_config: dict,
        check: bool,
        num_kv_heads: int,
    ):
        self.chunks, self.base, self.adapters, self.num_kv_heads = chunks, base, adapters, num_kv_heads
        self.mode, self.peft_config, self.check = mode, peft_config, check
        self.base_synced = False
        self.linears = lora_linears_by_name(chunks) if mode == "merged" else {}

    def sync(self, rollout, stats: ReshardStats) -> None:
        stats.lora_sync = self.mode
        if self.mode == "merged":
            merged = {name: merged_weight(linear) for name, linear in self.linears.items()}
            for bucket in self.base.buckets(stats, replaced=merged, only=self.base_synced):
                stats.engine_loader = rollout.load_weights(bucket)
            self.base_synced = True
            return
        if not self.base_synced:
            for bucket in self.base.buckets(stats):
                stats.engine_loader = rollout.load_weights(bucket)
            self.base_synced = True
        tensors = self.adapters.tensors_for_engine(stats)
        report = rollout.load_adapter(tensors, self.peft_config)
        stats.adapter_bytes += report["bytes"]
        if self.check:
            self._check(rollout, tensors)

    def _check(self, rollout, tensors: dict[str, torch.Tensor]) -> None:
        from megarl.rollout.vllm_lora import region_checksums

        plan = self.adapters.plan
        held = rollout.engine_adapter_checksums()
        ours = region_checksums(tensors, plan.gen_tp, plan.gen_tp_rank(self.adapters.rank), self.num_kv_heads)
        bad = {
            n: (ours[n], held.get(n))
            for n in ours
            if held.get(n) is None or abs(held[n] - ours[n]) > 1e-6 * max(1.0, abs(ours[n]))
        }
        if bad:
            name, (want, got) = next(iter(bad.items()))
            raise RuntimeError(
                f"actor.lora.check_sync: the engine holds other adapter values than the trainer for "
                f"{len(bad)} tensors, e.g. {name}: trainer {want}, engine {got}"
            )
