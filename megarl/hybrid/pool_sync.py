"""Shard-to-shard weight sync from the actor's training ranks to a separate rollout pool.

    training rank                                         engine rank
    PoolSender.send(version)                              PoolReceiver.buckets(version)
      its own megatron TP shards -> HF pieces               irecv bucket k+1 while bucket k loads
      (reshard.hf_pieces: no gather of any kind)            full-shaped HF tensors, only its region
      per bucket, per engine rank: the slices the           written -> VLLMRollout.load_weights
      PoolSyncPlan assigns it, one isend (tag = bucket)     received bytes counted against the floor

Both sides walk one table of HF tensors (name, module, kind, full shape, dtype, owning PP stages,
Megatron's padded vocabulary), which training rank 0 builds once (a collective over the training world:
`reshard.global_table`) and publishes through the bridge's store, and cut it into the same buckets
(whole modules: q/k/v and gate/up always travel together). Each (training rank, engine rank, bucket) is
one message holding the planned slices in table order, so the receiver knows every offset. A sender
posts its sends and moves on to the next bucket, waiting for the sends of bucket k-2 only (at most two
buckets of send buffers in flight); the receiver posts bucket k+1's receives before handing bucket k to
the engine. The transport is the PoolBridge's group (gloo on CPU).

A parameter that every training rank holding it finds bit-equal to what it sent at the last sync over
this bridge is left out by both sides: each training rank keeps a host copy of its shards as last sent
(so the sync costs one more copy of this rank's shards in host memory), publishes its list of unchanged
parameters in the store, and everyone skips those all holders list. The floor of that sync is then the
bytes of the changed parameters' engine shards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from megarl.distributed.backend import collective_timeout
from megarl.distributed.layout import ParallelLayout
from megarl.distributed.param_kind import ParamKind
from megarl.distributed.pool_plan import PoolSyncPlan, Slice, shard_dim
from megarl.errors import MegarlError
from megarl.hybrid.pool_bridge import PoolBridge
from megarl.hybrid.reshard import HFBucket, global_table, hf_pieces, local_params, module_of
from megarl.models.convert import llama
from megarl.models.from_hf import ModelArchitecture

_TABLE_KEY = "pool_sync_table"
_UNCHANGED_KEY = "pool_sync_unchanged/{version}/{rank}"
_IN_FLIGHT = 2  # buckets of sends a training rank keeps posted before waiting for the oldest


class PoolSyncError(MegarlError, RuntimeError):
    """The separate rollout pool cannot take the actor's weights this way."""


@dataclass(frozen=True)
class HFParam:
    """One HF tensor of the model as both pools see it."""

    name: str
    source: str  # the megatron parameter it is (part of)
    kind: str
    shape: tuple[int, ...]  # full HF shape
    dtype: str
    owners: tuple[int, ...]  # PP stages holding it
    train_padded: int | None  # VOCAB: megatron's padded vocabulary rows

    @property
    def module(self) -> str:
        """The megatron module it belongs to: buckets close only between modules."""
        return module_of(self.source)

    @property
    def length(self) -> int:
        dim = shard_dim(self.kind)
        return self.shape[0 if dim is None else dim]

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype.split(".")[-1])

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.torch_dtype.itemsize


@dataclass(frozen=True)
class PoolTable:
    """What training rank 0 publishes to the engines once per bridge."""

    params: list[HFParam]
    buckets: list[list[int]]  # indices into params
    world_size: int  # the training layout
    tp: int
    pp: int

    def layout(self) -> ParallelLayout:
        return ParallelLayout(world_size=self.world_size, tp=self.tp, pp=self.pp)


@dataclass
class PoolSyncStats:
    """What one sync moved on this rank (a training rank sends, an engine rank receives), and when."""

    version: int
    rank: int  # in the pool's own world
    sent_bytes: int = 0
    received_bytes: int = 0
    floor_bytes: int = 0  # engine ranks: the bytes of their engine shard (PoolSyncPlan.floor_bytes)
    tensors: int = 0
    buckets: int = 0
    largest_bucket_bytes: int = 0
    skipped: bool = False  # already at this version: nothing moved
    unchanged_tensors: int = 0  # HF tensors left out: their parameter is unchanged since the last sync
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Received / floor (1.0 when both are zero)."""
        if self.floor_bytes == 0:
            return 1.0 if self.received_bytes == 0 else float("inf")
        return self.received_bytes / self.floor_bytes

    def report(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}

    def add_seconds(self, phase: str, since: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - since


def build_table(entries, arch: ModelArchitecture, layout: ParallelLayout, bucket_bytes: int) -> PoolTable:
    """The HF tensors of the megatron parameter table `entries` (reshard.global_table), and buckets of
    about `bucket_bytes` (full tensors) made of whole modules."""
    params = []
    for entry in entries:
        param, hf_names = llama.param_map(entry.name, arch)
        meta = torch.empty(entry.shape, dtype=entry.dtype, device="meta")
        dim = shard_dim(param.kind)
        for name, local in hf_pieces(param, hf_names, meta, arch):
            shape, padded = list(local.shape), None
            if param.kind is ParamKind.VOCAB:
                padded, shape[0] = shape[0] * layout.tp, arch.vocab_size
            elif dim is not None:
                shape[dim] *= layout.tp
            params.append(
                HFParam(
                    name,
                    entry.name,
                    str(param.kind),
                    tuple(shape),
                    str(entry.dtype),
                    entry.owners,
                    padded,
                )
            )
    buckets: list[list[int]] = []
    bucket: list[int] = []
    size, module = 0, None
    for i, p in enumerate(params):
        if bucket and size >= bucket_bytes and p.module != module:
            buckets.append(bucket)
            bucket, size = [], 0
        module = p.module
        bucket.append(i)
        size += p.nbytes
    if bucket:
        buckets.append(bucket)
    return PoolTable(params, buckets, layout.world_size, layout.tp, layout.pp)


def unchanged_sources(bridge: PoolBridge, version: int, layout: ParallelLayout, table: PoolTable) -> set[str]:
    """The megatron parameters left out of the sync of `version`: unchanged since the last sync on
    every training rank that holds them. Every training rank publishes its own list; both pools
    read them all, so senders and receivers agree on what travels."""
    held: dict[str, int] = {}  # how many ranks hold each parameter
    for p in table.params:
        if p.source not in held:
            held[p.source] = sum(layout.coordinates(r).pp in p.owners for r in range(layout.world_size))
    votes: dict[str, int] = {}
    for rank in range(layout.world_size):
        for name in bridge.read(_UNCHANGED_KEY.format(version=version, rank=rank)):
            votes[name] = votes.get(name, 0) + 1
    return {name for name, n in votes.items() if n == held.get(name)}


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


class PoolSender:
    """A training rank's side of the sync (collective over the training world at construction: every
    training rank builds it, joining the bridge as bridge rank = its training rank)."""

    def __init__(
        self,
        local: dict[str, torch.Tensor],
        table: PoolTable,
        arch: ModelArchitecture,
        layout: ParallelLayout,
        rank: int,
        bridge: PoolBridge,
        engine_ranks: int,
        engine_tp: int,
        skip_unchanged: bool = False,
    ) -> None:
        self.local, self.table, self.arch = local, table, arch
        self.skip_unchanged = skip_unchanged  # rollout.sync_skip_unchanged: keeps a host copy to compare
        self.layout, self.rank, self.bridge = layout, rank, bridge
        self.plan = PoolSyncPlan(layout, engine_ranks, engine_tp, arch.num_kv_heads)
        if rank == 0:
            bridge.publish(_TABLE_KEY, table)
        self.version = 0  # the last version the engines got: model.path's weights, which they start from
        self._last_sent: dict[str, torch.Tensor] = {}  # megatron name -> a host copy of what was sent

    @classmethod
    def join(
        cls,
        worker,
        host: str,
        port: int,
        engine_ranks: int,
        engine_tp: int,
    ) -> PoolSender:
        """Join the bridge from an actor worker (`ActorRole`): megatron actors only."""
        backend = getattr(worker.spec, "backend", "megatron")
        if backend != "megatron":
            raise PoolSyncError(
                f"rollout.placement=separate needs actor.backend=megatron (got actor.backend={backend}): the "
                "shard-to-shard weight sync reads Megatron's TP shards; set actor.backend=megatron or "
                "rollout.placement=colocated"
            )
        PoolSyncPlan(worker.layout, engine_ranks, engine_tp, worker.arch.num_kv_heads)  # its checks first
        world, rank = worker.layout.world_size, worker.env.rank
        # the table first: a collective over the training world, before anyone waits on the bridge
        local = local_params(worker.chunks)
        entries = global_table(local, worker.arch, worker.layout.coordinates(rank).pp)
        r = worker.rollout_spec.rollout
        table = build_table(entries, worker.arch, worker.layout, r.reshard_bucket_mib << 20)
        bridge = PoolBridge(host, port, rank, world + engine_ranks, collective_timeout().total_seconds())
        return cls(
            local,
            table,
            worker.arch,
            worker.layout,
            rank,
            bridge,
            engine_ranks,
            engine_tp,
            r.sync_skip_unchanged,
        )

    def send(self, version: int) -> PoolSyncStats:
        """Send the current weights as `version` (collective with every engine rank's `PoolReceiver.buckets`);
        a no-op when this bridge already carried `version` or a later one."""
        stats = PoolSyncStats(version=version, rank=self.rank)
        if version <= self.version:
            stats.skipped = True
            return stats
        start = time.perf_counter()
        if self.rank == 0:
            self.bridge.set_pending_version(version)
        mine = sorted(n for n, p in self.local.items() if self._unchanged(n, p))
        self.bridge.publish(_UNCHANGED_KEY.format(version=version, rank=self.rank), mine)
        skip = unchanged_sources(self.bridge, version, self.layout, self.table)
        stats.unchanged_tensors = sum(p.source in skip for p in self.table.params)
        pieces = self._local_by_hf_name()
        n_train = self.layout.world_size
        in_flight: list[list] = []
        for tag, bucket in enumerate(self.table.buckets):
            t0 = time.perf_counter()
            messages: dict[int, list[torch.Tensor]] = {}
            for i in bucket:
                p = self.table.params[i]
                if p.name not in pieces or p.source in skip:
                    continue  # another stage's parameter, or unchanged since the last sync
                local, first = pieces[p.name]
                for s in self._my_slices(p):
                    messages.setdefault(s.engine_rank, []).append(_as_bytes(_narrow(p, local, first, s)))
            stats.add_seconds("convert", t0)
            works = []
            size = 0
            for engine_rank, parts in messages.items():
                buf = torch.cat(parts)
                works.append((self.bridge.isend(buf, n_train + engine_rank, tag), buf))
                size += buf.numel()
                stats.tensors += len(parts)
            stats.sent_bytes += size
            stats.buckets += bool(messages)
            stats.largest_bucket_bytes = max(stats.largest_bucket_bytes, size)
            in_flight.append(works)
            if len(in_flight) > _IN_FLIGHT:
                t0 = time.perf_counter()
                for work, _ in in_flight.pop(0):
                    work.wait()
                stats.add_seconds("send_wait", t0)
        t0 = time.perf_counter()
        for works in in_flight:
            for work, _ in works:
                work.wait()
        stats.add_seconds("send_wait", t0)
        stats.seconds["total"] = time.perf_counter() - start
        self.version = version
        if self.skip_unchanged:
            t0 = time.perf_counter()
            self._last_sent = {n: p.detach().to("cpu", copy=True) for n, p in self.local.items()}
            stats.add_seconds("keep_copy", t0)
        return stats

    def _unchanged(self, name: str, param: torch.Tensor) -> bool:
        """Whether `param` equals what the last sync sent, bit for bit. (torch's in-place version
        counter does not see megatron's optimizer writing through `.data`, so it cannot tell.)"""
        last = self._last_sent.get(name)
        return last is not None and torch.equal(param.detach().to("cpu"), last)

    def _local_by_hf_name(self) -> dict[str, tuple[torch.Tensor, int]]:
        """Every HF piece this rank holds: name -> (local part in HF coordinates, the row it starts at)."""
        out = {}
        tp_rank = self.layout.coordinates(self.rank).tp
        for name in self.local:
            param, hf_names = llama.param_map(name, self.arch)
            for hf_name, local in hf_pieces(param, hf_names, self.local[name].detach(), self.arch):
                first = 0
                if param.kind.tp_sharded:
                    dim = shard_dim(param.kind)
                    assert dim is not None
                    first = tp_rank * local.shape[dim]  # equal shards (megatron pads the vocabulary)
                out[hf_name] = (local, first)
        return out

    def _my_slices(self, p: HFParam) -> Iterator[Slice]:
        for engine_rank in range(self.plan.engine_ranks):
            for s in self.plan.slices(engine_rank, p.kind, p.length, p.owners, p.train_padded):
                if s.train_rank == self.rank:
                    yield s

    def close(self) -> None:
        self.bridge.close()


def _narrow(p: HFParam, local: torch.Tensor, first: int, s: Slice) -> torch.Tensor:
    dim = shard_dim(p.kind)
    if dim is None:
        return local
    return local.narrow(dim, s.start - first, s.length)


class PoolReceiver:
    """An engine rank's side of the sync: bridge rank n_train + its engine rank."""

    def __init__(self, bridge: PoolBridge, engine_rank: int, engine_ranks: int, engine_tp: int) -> None:
        self.bridge, self.engine_rank = bridge, engine_rank
        self.table: PoolTable = bridge.read(_TABLE_KEY)
        self.n_train = self.table.world_size
        self.plan = PoolSyncPlan(self.table.layout(), engine_ranks, engine_tp)
        self.version = 0  # the weights of model.path

    def floor_bytes(self, skip: Collection[str] = ()) -> int:
        """The bytes of this engine rank's shard of every tensor (less those of the parameters in
        `skip`): what a sync must receive."""
        return sum(
            self.plan.floor_bytes(self.engine_rank, p.kind, p.shape, p.torch_dtype.itemsize)
            for p in self.table.params
            if p.source not in skip
        )

    def _slices(self, p: HFParam) -> list[Slice]:
        return self.plan.slices(self.engine_rank, p.kind, p.length, p.owners, p.train_padded)

    def _post(self, tag: int, skip: Collection[str]) -> list[tuple[int, torch.Tensor, Any]]:
        sizes: dict[int, int] = {}
        for i in self.table.buckets[tag]:
            p = self.table.params[i]
            if p.source in skip:
                continue
            row = p.nbytes // p.length
            for s in self._slices(p):
                sizes[s.train_rank] = sizes.get(s.train_rank, 0) + s.length * row
        posted = []
        for src, size in sorted(sizes.items()):
            buf = torch.empty(size, dtype=torch.uint8)
            posted.append((src, buf, self.bridge.irecv(buf, src, tag)))
        return posted

    def buckets(self, version: int, stats: PoolSyncStats) -> Iterator[HFBucket]:
        """The HF buckets of `version` (collective with every training rank's `PoolSender.send`); nothing
        when this engine already holds `version` or a later one. Fills `stats`."""
        if version <= self.version:
            stats.skipped = True
            return
        start = time.perf_counter()
        skip = unchanged_sources(self.bridge, version, self.plan.train_layout, self.table)
        stats.unchanged_tensors = sum(p.source in skip for p in self.table.params)
        stats.floor_bytes += self.floor_bytes(skip)
        n = len(self.table.buckets)
        pending = self._post(0, skip)
        for tag in range(n):
            t0 = time.perf_counter()
            current, pending = pending, (self._post(tag + 1, skip) if tag + 1 < n else [])
            for _, buf, work in current:
                work.wait()
                stats.received_bytes += buf.numel()
            stats.add_seconds("recv_wait", t0)
            bucket = self._unpack(tag, current, stats, skip)
            if bucket:
                t0 = time.perf_counter()
                yield bucket
                stats.add_seconds("engine_load", t0)
        self.version = version
        stats.seconds["total"] = time.perf_counter() - start

    def _unpack(self, tag: int, received, stats: PoolSyncStats, skip: Collection[str]) -> HFBucket:
        params = [self.table.params[i] for i in self.table.buckets[tag]]
        params = [p for p in params if p.source not in skip]
        full = {p.name: torch.empty(p.shape, dtype=p.torch_dtype) for p in params}
        offsets = {src: 0 for src, _, _ in received}
        bufs = {src: buf for src, buf, _ in received}
        size = 0
        for p in params:
            dim = shard_dim(p.kind)
            for s in self._slices(p):
                region = full[p.name] if dim is None else full[p.name].narrow(dim, s.start, s.length)
                n = region.numel() * region.element_size()
                off = offsets[s.train_rank]
                region.copy_(bufs[s.train_rank][off : off + n].view(p.torch_dtype).reshape(region.shape))
                offsets[s.train_rank] = off + n
                size += n
        if params:
            stats.buckets += 1
            stats.tensors += len(params)
            stats.largest_bucket_bytes = max(stats.largest_bucket_bytes, size)
        return [(p.name, full[p.name]) for p in params]

    def close(self) -> None:
        self.bridge.close()
