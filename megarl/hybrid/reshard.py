"""Regroup the actor's training shards into the generation layout, tensor by tensor (3D-HybridEngine).

For every parameter of the model, in one global order that all ranks share:
  1. PP broadcast    the stage that owns it broadcasts this rank's training TP shard over the PP group
                     (skipped when every stage holds it, e.g. tied embeddings at PP=2); a routed expert's
                     only in the PP groups of its expert-parallel rank, which then
     EP broadcast    sends it over the expert-parallel group (every rank then holds its TP shard of
                     every expert);
  2. micro-DP gather an all-gather inside the plan's gather group (s = t/t_g consecutive TP ranks)
                     assembles the generation-TP shard: fused QKV stays grouped per query group,
                     SwiGLU [gate_i; up_i] shards are regrouped to [gate_g; up_g];
  3. HF tensors      the generation shard is split into its HF tensors (q/k/v, gate/up) and written
                     into full-shaped HF tensors at exactly the region that generation TP rank's engine
                     shard reads (the rest is never touched, so never sent). The engine's weight loader
                     (vLLM's `reload_weights`) narrows each full tensor to its shard; a CPU engine of
                     one TP rank takes the tensors whole (`megarl.rollout.vllm_cpu_load`).
Tensors are handed out in buckets of about `bucket_bytes`; the parts of one module (q, k, v and their
biases; gate, up; every expert of an MoE block) always share a bucket, because pushing half of an engine
layer corrupts it.

An engine with expert parallelism (`plan.gen_ep`, vLLM's enable_expert_parallel) holds whole experts of
its block instead: each routed expert's training TP shards go point to point from a rank holding them
(on the owning stage, in its expert-parallel rank, the receiver's expert-data-parallel index) to each
rank whose block holds the expert and lacks that shard; the others see none of that expert's tensors.

Every rank counts the bytes it receives; `GenerationPlan.received_bytes` gives the floor for the same
parameters, so `stats.ratio` is 1.00 for this path. The naive path (`naive=True`) all-gathers every
full tensor to every rank instead, for comparison.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from megarl.distributed.backend import collective_timeout
from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.param_kind import ParamKind
from megarl.distributed.platform import platform
from megarl.distributed.pool_plan import shard_dim
from megarl.models.convert import llama
from megarl.models.convert.loader import global_named_parameters
from megarl.models.from_hf import ModelArchitecture

HFBucket = list[tuple[str, torch.Tensor]]


@dataclass
class ReshardStats:
    """What one reshard moved on this rank, and how long each phase took (seconds)."""

    received_bytes: int = 0
    floor_bytes: int = 0
    tensors: int = 0
    buckets: int = 0
    largest_bucket_bytes: int = 0
    bucket_bytes: int = 0  # bytes of the HF tensors handed out in buckets (to this rank's engine)
    engine_loader: str = ""  # what put the buckets into the engine (VLLMRollout.load_weights)
    # LoRA: "adapter" (the adapter tensors only; the base once, at the first sync) or "merged"
    lora_sync: str = ""
    adapter_bytes: int = 0  # bytes of adapter tensors handed to this rank's engine
    seconds: dict[str, float] = field(
        default_factory=lambda: {"pp_broadcast": 0.0, "gather": 0.0, "to_hf": 0.0}
    )

    @property
    def ratio(self) -> float:
        """Bytes received / the plan's floor (1.0 when both are zero: nothing needed, nothing sent)."""
        if self.floor_bytes == 0:
            return 1.0 if self.received_bytes == 0 else float("inf")
        return self.received_bytes / self.floor_bytes


@dataclass(frozen=True)
class ParamEntry:
    name: str  # megatron name, global layer index (and global expert index)
    owners: tuple[int, ...]  # PP stages holding it
    shape: tuple[int, ...]  # training TP shard shape
    dtype: torch.dtype
    expert: int | None = None  # a routed expert's index: only its expert-parallel rank holds it


def local_params(chunks: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """This rank's megatron parameters by global name (a tied output layer under its embedding's name)."""
    local = {}
    for chunk in chunks:
        for name, param in global_named_parameters(chunk):
            if getattr(param, "shared", False) and name == "output_layer.weight":
                name = "embedding.word_embeddings.weight"  # the last stage's tied copy
            local.setdefault(name, param)
    return local


def global_table(local: dict[str, torch.Tensor], arch: ModelArchitecture, pp_stage: int) -> list[ParamEntry]:
    """Every parameter of the model in HF order, with the PP stages holding it and its TP shard's shape
    and dtype (collective over the training world: each rank tells what its stage holds)."""
    mine = {n: (tuple(p.shape), str(p.dtype)) for n, p in local.items()}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (pp_stage, mine))
    owners: dict[str, set[int]] = {}
    shapes: dict[str, tuple] = {}
    for stage, params in everyone:
        for name, (shape, dtype) in params.items():
            owners.setdefault(name, set()).add(stage)
            shapes[name] = (shape, dtype)
    entries = []
    for name in llama.megatron_names(arch):
        if name not in owners:
            raise KeyError(f"no rank holds {name}; the model and the name table disagree")
        shape, dtype = shapes[name]
        param, _ = llama.param_map(name, arch)
        expert = llama.split_expert_name(name)[1] if param.expert else None
        entries.append(
            ParamEntry(name, tuple(sorted(owners[name])), shape, getattr(torch, dtype.split(".")[-1]), expert)
        )
    return entries


class Resharder:
    """Built once per actor (collective: every rank of the training world constructs it)."""

    def __init__(
        self,
        chunks: list[torch.nn.Module],
        arch: ModelArchitecture,
        plan: GenerationPlan,
        bucket_bytes: int = 64 << 20,
        naive: bool = False,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.arch, self.plan, self.bucket_bytes, self.naive = arch, plan, bucket_bytes, naive
        self.rank = dist.get_rank()
        self.coords = plan.layout.coordinates(self.rank)
        self.local = local_params(chunks)
        self.replaced: dict[str, torch.Tensor] = {}
        self.entries = global_table(self.local, self.arch, self.coords.pp)
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.pp_ranks = plan.layout.pp_group_ranks(self.rank)  # indexed by stage
        self.tp_group = ps.get_tensor_model_parallel_group()
        if arch.num_experts:
            self.ep_group = ps.get_expert_model_parallel_group()
            self.ep_ranks = plan.layout.ep_group_ranks(self.rank)  # indexed by EP rank
            self.my_experts = plan.training_experts(self.rank, arch.num_experts)
            self.expert_holders = _expert_holders(plan)
            # gen_ep: expert -> the ranks whose engine block holds it
            self.block_ranks = {
                x: [r for r in range(plan.layout.world_size) if x in plan.engine_experts(r, arch.num_experts)]
                for x in range(arch.num_experts)
            }
        self.gather_group = None
        for ranks in plan.gather_groups:  # every rank creates every group, in the same order
            group = dist.new_group(ranks, timeout=collective_timeout()) if len(ranks) > 1 else None
            if self.rank in ranks:
                self.gather_group = group

    # ---- the transition -----------------------------------------------------------------------------

    def buckets(
        self,
        stats: ReshardStats | None = None,
        replaced: dict[str, torch.Tensor] | None = None,
        only: bool = False,
    ) -> Iterator[HFBucket]:
        """HF-named tensors for this rank's engine shard, in buckets; fills `stats` as it goes.
        `replaced`: megatron names → shards sent instead of the parameters' own (LoRA's merged weights),
        and with `only` nothing but their modules (a weight with its bias) is sent."""
        stats = stats if stats is not None else ReshardStats()
        self.replaced = replaced or {}
        wanted = {module_of(name) for name in self.replaced}  # an engine layer is loaded whole (its bias too)
        bucket: HFBucket = []
        size, module = 0, None
        for entry in self.entries:
            if only and module_of(entry.name) not in wanted:
                continue
            # A bucket closes only between modules: the engine processes a layer (weight and bias, or
            # q/k/v) once, when all of it has arrived.
            if size >= self.bucket_bytes and module_of(entry.name) != module:
                yield self._flush(bucket, size, stats)
                bucket, size = [], 0
            module = module_of(entry.name)
            if self.plan.gen_ep and entry.expert is not None and not self.naive:
                tensors = self._whole_expert(entry, stats)  # [] outside this rank's block
            else:
                tensors = self._to_hf(entry, self._on_this_stage(entry, stats), stats)
            bucket.extend(tensors)
            size += sum(t.numel() * t.element_size() for _, t in tensors)
        if bucket:
            yield self._flush(bucket, size, stats)

    @staticmethod
    def _flush(bucket: HFBucket, size: int, stats: ReshardStats) -> HFBucket:
        stats.buckets += 1
        stats.tensors += len(bucket)
        stats.largest_bucket_bytes = max(stats.largest_bucket_bytes, size)
        stats.bucket_bytes += size
        return bucket

    def _on_this_stage(self, entry: ParamEntry, stats: ReshardStats) -> torch.Tensor:
        """This rank's training TP shard of `entry`, broadcast from its owning stage (and a routed expert
        from its expert-parallel rank) if needed."""
        start = time.perf_counter()
        kind = llama.param_map(entry.name, self.arch)[0].kind
        param_bytes = (
            math.prod(entry.shape) * entry.dtype.itemsize * (self.plan.layout.tp if kind.tp_sharded else 1)
        )
        expert_rank = None if entry.expert is None else entry.expert // len(self.my_experts)
        if expert_rank is None:
            stats.floor_bytes += self.plan.received_bytes(self.rank, param_bytes, kind, entry.owners)
        else:
            stats.floor_bytes += self.plan.expert_received_bytes(
                self.rank, param_bytes, entry.expert, self.arch.num_experts, kind, entry.owners[0]
            )
        on_expert_rank = expert_rank is None or entry.expert in self.my_experts
        if self.coords.pp in entry.owners and on_expert_rank:
            shard = self.replaced.get(entry.name, self.local[entry.name]).detach()
        else:
            shard = torch.empty(entry.shape, dtype=entry.dtype, device=platform().device)
        if len(entry.owners) < self.plan.layout.pp and on_expert_rank:
            shard = shard.contiguous()
            dist.broadcast(shard, src=self.pp_ranks[entry.owners[0]], group=self.pp_group)
            if self.coords.pp != entry.owners[0]:
                stats.received_bytes += shard.numel() * shard.element_size()
        if expert_rank is not None and self.plan.layout.ep > 1:
            shard = shard.contiguous()
            dist.broadcast(shard, src=self.ep_ranks[expert_rank], group=self.ep_group)
            if not on_expert_rank:
                stats.received_bytes += shard.numel() * shard.element_size()
        stats.seconds["pp_broadcast"] += time.perf_counter() - start
        return shard

    def _whole_expert(self, entry: ParamEntry, stats: ReshardStats) -> HFBucket:
        """gen_ep: the whole HF tensors of a routed expert for the ranks whose engine block holds it, each
        training TP shard they lack sent point to point by one rank holding it; [] elsewhere."""
        start = time.perf_counter()
        param, hf_names = llama.param_map(entry.name, self.arch)
        layout, experts = self.plan.layout, self.arch.num_experts
        stats.floor_bytes += self.plan.expert_received_bytes(
            self.rank,
            math.prod(entry.shape) * entry.dtype.itemsize * layout.tp,
            entry.expert,
            experts,
            param.kind,
            entry.owners[0],
        )
        ep_rank = entry.expert // len(self.my_experts)
        block_ranks = self.block_ranks[entry.expert]
        pieces: list[torch.Tensor | None] = [None] * layout.tp
        ops = []
        for receiver in block_ranks:
            _, edp = layout.expert_coordinates(receiver)
            for i in range(layout.tp):
                holders = self.expert_holders[(entry.owners[0], ep_rank, i)]
                source = receiver if receiver in holders else holders[edp % len(holders)]
                if source == self.rank:
                    shard = self.replaced.get(entry.name, self.local[entry.name]).detach().contiguous()
                    if receiver == self.rank:
                        pieces[i] = shard
                    else:
                        ops.append(dist.isend(shard, receiver))
                elif receiver == self.rank:
                    pieces[i] = torch.empty(entry.shape, dtype=entry.dtype, device=platform().device)
                    ops.append(dist.irecv(pieces[i], source))
                    stats.received_bytes += pieces[i].numel() * pieces[i].element_size()
        for op in ops:
            op.wait()
        stats.seconds["gather"] += time.perf_counter() - start
        return _hf_regions(param, hf_names, pieces, 0, 1, self.arch) if self.rank in block_ranks else []

    def _to_hf(self, entry: ParamEntry, shard: torch.Tensor, stats: ReshardStats) -> HFBucket:
        start = time.perf_counter()
        param, hf_names = llama.param_map(entry.name, self.arch)
        if not param.kind.tp_sharded:
            pieces, group_size, region = [shard], 1, None
        elif self.naive:
            pieces = self._all_gather(shard, self.tp_group, self.plan.layout.tp, stats)
            group_size, region = self.plan.layout.tp, 0
        else:
            group_size = self.plan.stride
            pieces = (
                self._all_gather(shard, self.gather_group, group_size, stats) if group_size > 1 else [shard]
            )
            region = self.coords.tp // group_size
        stats.seconds["gather"] += time.perf_counter() - start
        start = time.perf_counter()
        if region is None:
            out = [(hf_names[0], pieces[0])]
        else:
            parts = self.plan.layout.tp // group_size  # regions of the full tensor
            out = _hf_regions(param, hf_names, pieces, region, parts, self.arch)
        stats.seconds["to_hf"] += time.perf_counter() - start
        return out

    def _all_gather(self, shard: torch.Tensor, group, size: int, stats: ReshardStats) -> list[torch.Tensor]:
        shard = shard.contiguous()
        pieces = [torch.empty_like(shard) for _ in range(size)]
        dist.all_gather(pieces, shard, group=group)
        stats.received_bytes += (size - 1) * shard.numel() * shard.element_size()
        return pieces


def _expert_holders(plan: GenerationPlan) -> dict[tuple[int, int, int], list[int]]:
    """(PP stage, expert-parallel rank, TP rank) -> the ranks holding that TP shard of that EP rank's
    experts on that stage (one per expert-data-parallel replica, in that order)."""
    holders: dict[tuple[int, int, int], list[int]] = {}
    for rank in range(plan.layout.world_size):
        c = plan.layout.coordinates(rank)
        ep_rank, edp = plan.layout.expert_coordinates(rank)
        holders.setdefault((c.pp, ep_rank, c.tp), []).append((edp, rank))
    return {key: [r for _, r in sorted(members)] for key, members in holders.items()}


def hf_pieces(
    param: llama.ParamMap, hf_names: list[str], shard: torch.Tensor, arch: ModelArchitecture
) -> HFBucket:
    """One megatron TP shard (or several concatenated) as its HF tensors' local parts, in HF coordinates:
    q, k and v of a fused QKV shard, gate and up of an fc1 shard, the shard itself otherwise (a VOCAB
    shard with its padding rows)."""
    if param.kind is ParamKind.GATE_UP:
        gate, up = shard.chunk(2, dim=0)
        return [(hf_names[0], gate), (hf_names[1], up)]
    if param.kind is ParamKind.QKV:
        d, per_group = arch.head_dim, arch.num_heads // arch.num_kv_heads
        rest = shard.shape[1:]
        groups = shard.shape[0] // ((per_group + 2) * d)
        q, k, v = shard.reshape(groups, (per_group + 2) * d, *rest).split([per_group * d, d, d], dim=1)
        return [(name, t.reshape(-1, *rest)) for name, t in zip(hf_names, (q, k, v))]
    return [(hf_names[0], shard)]


def _hf_regions(
    param: llama.ParamMap,
    hf_names: list[str],
    pieces: list[torch.Tensor],
    region: int,
    parts: int,
    arch: ModelArchitecture,
) -> HFBucket:
    """Full-shaped HF tensors holding, at region `region` of `parts`, the data of the concatenated TP
    `pieces` (megatron layout); elsewhere they are left unwritten."""
    if param.kind is ParamKind.VOCAB:
        rows = torch.cat(pieces, dim=0)
        full = rows.new_empty(arch.vocab_size, *rows.shape[1:])
        first = region * rows.shape[0]
        valid = max(0, min(rows.shape[0], arch.vocab_size - first))
        full[first : first + valid] = rows[:valid]
        return [(hf_names[0], full)]
    dim = shard_dim(param.kind)
    if dim is None:
        raise AssertionError(f"unhandled parameter kind {param.kind}")
    if param.kind is ParamKind.GATE_UP:  # each piece is [gate_i; up_i]
        local = [hf_pieces(param, hf_names, piece, arch) for piece in pieces]
        joined = [(name, torch.cat([p[i][1] for p in local], dim=dim)) for i, name in enumerate(hf_names)]
    else:  # QKV: whole query groups only once joined (a training TP shard may hold part of one)
        joined = hf_pieces(param, hf_names, torch.cat(pieces, dim=dim), arch)
    return [(name, _place(t, region, parts, dim)) for name, t in joined]


def _place(local: torch.Tensor, region: int, parts: int, dim: int) -> torch.Tensor:
    """`local` written into region `region` of a tensor `parts` times its size along `dim`."""
    shape = list(local.shape)
    shape[dim] *= parts
    full = local.new_empty(shape)
    full.narrow(dim, region * local.shape[dim], local.shape[dim]).copy_(local)
    return full


def module_of(name: str) -> str:
    """The engine layer a megatron parameter fills: its module, or for a routed expert the MoE block's
    experts (one fused engine layer holds every expert of a block)."""
    head, sep, _ = name.partition(".local_experts.")
    return head if sep else name.rsplit(".", 1)[0]
