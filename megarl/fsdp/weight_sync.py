"""An FSDP actor's weights into its colocated vLLM engine's layout, moving only the plan's floor.

FSDP2 leaves rank r with rows `torch.chunk(full, world)[r]` of every parameter; its engine TP shard reads
one region of each HF tensor (`FSDPGenerationPlan.engine_region`). For each bucket of parameters, in one
order every rank shares, each rank sends every other rank the intersection of its rows with that rank's
region, all in one `all_to_all_single` over a flat byte buffer, then writes what it holds and what it got
into full-shaped HF tensors at exactly its region (the rest is left unwritten: the engine's loader
narrows each tensor to its shard, and at rollout.tp=1 the region is the whole tensor). So each rank
receives its region less what it held, once: `FSDPGenerationPlan.received_bytes`, the floor, and
`stats.ratio` is 1.00. `naive=True` instead gathers every full tensor on every rank (`DTensor.full_tensor`,
what an FSDP trainer does by default), for comparison: (w−1)/w of the model per rank.

Buckets follow `Resharder.buckets`' contract: HF names as the HF model's parameters (a tied lm_head is the
embedding, sent once as `embed_tokens.weight`, as vLLM's loaders expect), about `bucket_bytes` of full
tensors each, the parts of one engine layer (q/k/v, gate/up, a weight and its bias) in one bucket.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from megarl.distributed.fsdp_plan import ENGINE_LAYER_OF_MODULE, FSDPGenerationPlan, Region
from megarl.distributed.platform import platform
from megarl.hybrid.reshard import HFBucket, ReshardStats

# Wrappers that add a path component to parameter names without changing the HF model's layout.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


@dataclass(frozen=True)
class _Entry:
    name: str  # the HF parameter name
    param: torch.nn.Parameter
    shape: tuple[int, ...]  # the full tensor's
    sharded: bool  # an FSDP2 DTensor (Shard(0) over the world); otherwise every rank holds it whole


class FSDPWeightSync:
    """Built once per actor, on every rank of the FSDP world, over `model` (an HF model wrapped by
    `fully_shard`). `dtype`: what travels and reaches the engine (e.g. the engine's bf16 while the
    shards are fp32 master weights); default the parameters' own dtype."""

    def __init__(
        self,
        model: torch.nn.Module,
        plan: FSDPGenerationPlan,
        bucket_bytes: int = 64 << 20,
        naive: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.plan, self.bucket_bytes, self.naive, self.dtype = plan, bucket_bytes, naive, dtype
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world != plan.world_size:
            raise ValueError(
                f"the FSDP generation plan is for {plan.world_size} ranks, but this world has {self.world}"
            )
        self.entries = [_entry(name, param, plan) for name, param in model.named_parameters()]

    def buckets(self, stats: ReshardStats | None = None) -> Iterator[HFBucket]:
        """HF-named full-shaped tensors holding this rank's engine region, in buckets; fills `stats`."""
        stats = stats if stats is not None else ReshardStats()
        for group in self._bucket_plan():
            bucket = self._gather_naive(group, stats) if self.naive else self._exchange(group, stats)
            size = sum(t.numel() * t.element_size() for _, t in bucket)
            stats.buckets += 1
            stats.tensors += len(bucket)
            stats.largest_bucket_bytes = max(stats.largest_bucket_bytes, size)
            stats.bucket_bytes += size
            yield bucket

    # ---- the bucket plan (the same on every rank) ---------------------------------------------------

    def _bucket_plan(self) -> list[list[_Entry]]:
        layers: dict[str, list[_Entry]] = {}  # engine layer -> its parameters, in first-seen order
        for entry in self.entries:
            layers.setdefault(_engine_layer(entry.name), []).append(entry)
        buckets: list[list[_Entry]] = [[]]
        size = 0
        for parts in layers.values():
            if size >= self.bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].extend(parts)
            size += sum(_numel(e.shape) * self._dtype(e).itemsize for e in parts)
        return [b for b in buckets if b]

    def _dtype(self, entry: _Entry) -> torch.dtype:
        return self.dtype or entry.param.dtype

    # ---- the floor: one all-to-all per bucket -------------------------------------------------------

    def _exchange(self, group: list[_Entry], stats: ReshardStats) -> HFBucket:
        start = time.perf_counter()
        plan, me, device = self.plan, self.rank, platform().device
        sends: list[list[torch.Tensor]] = [[] for _ in range(self.world)]
        for entry in group:
            stats.floor_bytes += plan.received_bytes(
                entry.name, entry.shape, self._dtype(entry), me, entry.sharded
            )
            if not entry.sharded:
                continue
            local, lo = self._local_rows(entry)
            for dest in range(self.world):
                box = plan.piece(entry.name, entry.shape, me, dest) if dest != me else None
                if box is not None:
                    sends[dest].append(_bytes(_cut(local, box, lo)))
        in_splits = [sum(t.numel() for t in pieces) for pieces in sends]
        out_splits = [
            sum(self._piece_bytes(e, src) for e in group if e.sharded) if src != me else 0
            for src in range(self.world)
        ]
        flat = [t for pieces in sends for t in pieces]
        send = torch.cat(flat).to(device) if flat else torch.empty(0, dtype=torch.uint8, device=device)
        received = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
        if self.world > 1:
            dist.all_to_all_single(received, send, out_splits, in_splits)
        stats.received_bytes += received.numel()
        stats.seconds["gather"] += time.perf_counter() - start

        start = time.perf_counter()
        chunks = list(received.split(out_splits))
        offsets = [0] * self.world
        bucket: HFBucket = []
        for entry in group:
            dtype = self._dtype(entry)
            if not entry.sharded:
                bucket.append((entry.name, entry.param.detach().to(device=device, dtype=dtype)))
                continue
            full = torch.empty(entry.shape, dtype=dtype, device=device)
            local, lo = self._local_rows(entry)
            own = plan.piece(entry.name, entry.shape, me, me)
            if own is not None:
                _cut(full, own).copy_(_cut(local, own, lo))
            for src in range(self.world):
                box = plan.piece(entry.name, entry.shape, src, me) if src != me else None
                if box is None:
                    continue
                n = box.numel(entry.shape) * dtype.itemsize
                data = chunks[src][offsets[src] : offsets[src] + n]
                offsets[src] += n
                if data.storage_offset() % dtype.itemsize:  # after a piece of a narrower dtype
                    data = data.clone()
                target = _cut(full, box)
                target.copy_(data.view(dtype).view(target.shape))
            bucket.append((entry.name, full))
        stats.seconds["to_hf"] += time.perf_counter() - start
        return bucket

    def _piece_bytes(self, entry: _Entry, source: int) -> int:
        box = self.plan.piece(entry.name, entry.shape, source, self.rank)
        return box.numel(entry.shape) * self._dtype(entry).itemsize if box else 0

    def _local_rows(self, entry: _Entry) -> tuple[torch.Tensor, int]:
        """This rank's FSDP rows of `entry` in the travelling dtype, and the first row's index."""
        local = entry.param.to_local().detach()
        lo, hi = self.plan.fsdp_rows(self.rank, entry.shape[0])
        # FSDP2 may pad its local shard to ceil(rows/world) rows; only the real rows count
        if local.shape[0] < hi - lo or tuple(local.shape[1:]) != entry.shape[1:]:
            raise ValueError(
                f"{entry.name}: rank {self.rank} holds a shard of shape {tuple(local.shape)}, not rows "
                f"[{lo}, {hi}) of {entry.shape} as FSDP2's Shard(0) over {self.world} ranks gives"
            )
        return local[: hi - lo].to(self._dtype(entry)), lo

    # ---- the naive path -----------------------------------------------------------------------------

    def _gather_naive(self, group: list[_Entry], stats: ReshardStats) -> HFBucket:
        start = time.perf_counter()
        bucket: HFBucket = []
        for entry in group:
            dtype = self._dtype(entry)
            stats.floor_bytes += self.plan.received_bytes(
                entry.name, entry.shape, dtype, self.rank, entry.sharded
            )
            if entry.sharded:
                full = entry.param.detach().full_tensor().to(dtype)
                lo, hi = self.plan.fsdp_rows(self.rank, entry.shape[0])
                stats.received_bytes += (
                    _numel(entry.shape) - _numel((hi - lo, *entry.shape[1:]))
                ) * dtype.itemsize
            else:
                full = entry.param.detach().to(dtype)
            bucket.append((entry.name, full.to(platform().device)))
        stats.seconds["gather"] += time.perf_counter() - start
        return bucket


def _entry(name: str, param: torch.nn.Parameter, plan: FSDPGenerationPlan) -> _Entry:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    placements = getattr(param, "placements", None)
    if placements is None:
        return _Entry(name, param, tuple(param.shape), sharded=False)
    mesh = param.device_mesh
    ranks = mesh.mesh.flatten().tolist()
    if mesh.ndim != 1 or ranks != list(range(plan.world_size)) or len(placements) != 1:
        raise ValueError(
            f"{name}: sharded over a device mesh of ranks {mesh.mesh.tolist()}; the FSDP weight sync needs "
            f"a 1-D mesh of the whole world ({plan.world_size} ranks in order)"
        )
    placement = placements[0]
    if placement.is_replicate():
        return _Entry(name, param, tuple(param.shape), sharded=False)
    if not placement.is_shard(0):
        raise ValueError(f"{name}: placement {placement}; the FSDP weight sync needs Shard(0)")
    return _Entry(name, param, tuple(param.shape), sharded=True)


def _engine_layer(name: str) -> str:
    module = name.rpartition(".")[0]
    parent, _, leaf = module.rpartition(".")
    fused = ENGINE_LAYER_OF_MODULE.get(leaf)
    return f"{parent}.{fused}" if fused else module


def _cut(tensor: torch.Tensor, box: Region, first_row: int = 0) -> torch.Tensor:
    """The view of `box` in `tensor`, whose row 0 is row `first_row` of the full tensor."""
    view = tensor[box.rows[0] - first_row : box.rows[1] - first_row]
    return view if box.cols is None else view[:, box.cols[0] : box.cols[1]]


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
