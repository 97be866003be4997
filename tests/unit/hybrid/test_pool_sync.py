"""The pool weight sync end to end in one process: training ranks (threads holding megatron TP shards cut
from a tiny HF checkpoint) send over a real gloo bridge to engine ranks (threads), which must assemble
exactly their engine shard of every HF tensor, bit for bit, receiving exactly the plan's floor."""

from __future__ import annotations

import threading

import pytest
import torch

from megarl.distributed.launch import free_port
from megarl.distributed.layout import ParallelLayout
from megarl.distributed.param_kind import ParamKind
from megarl.distributed.pool_plan import shard_dim
from megarl.hybrid.pool_bridge import PoolBridge
from megarl.hybrid.pool_sync import PoolReceiver, PoolSender, PoolSyncStats, build_table
from megarl.hybrid.reshard import ParamEntry
from megarl.models.convert import llama, sharding
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.from_hf import ModelArchitecture

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny(tiny_models):
    """The session's tiny Qwen2: q/k/v biases, tied embeddings, 4 layers (PP=2 splits them)."""
    path = tiny_models["qwen2"]
    return ModelArchitecture.from_pretrained(path), HFCheckpointReader(path)


def _stage(name: str, arch: ModelArchitecture, pp: int) -> tuple[int, ...]:
    template, layer = llama.split_layer_name(name)
    if layer is not None:
        return (layer * pp // arch.num_layers,)
    if name == "embedding.word_embeddings.weight":
        return (0, pp - 1) if arch.tie_embeddings else (0,)
    return (pp - 1,)


def _training_ranks(arch, reader, layout: ParallelLayout):
    """Each training rank's megatron shards (what its stage holds) and the global parameter table."""
    padded = -(-arch.vocab_size // (128 * layout.tp)) * 128 * layout.tp  # megatron's padded vocabulary
    locals_ = [{} for _ in range(layout.world_size)]
    entries = []
    for name in llama.megatron_names(arch):
        param, hf_names = llama.param_map(name, arch)
        full = llama.merge(param, [reader.get(n) for n in hf_names], arch)
        owners = _stage(name, arch, layout.pp)
        shards = [sharding.shard(param.kind, full, r, layout.tp, padded) for r in range(layout.tp)]
        entries.append(ParamEntry(name, owners, tuple(shards[0].shape), shards[0].dtype))
        for rank in range(layout.world_size):
            c = layout.coordinates(rank)
            if c.pp in owners:
                locals_[rank][name] = shards[c.tp].clone()  # its own copy, as a rank's memory is
    return locals_, entries


def _sync(
    arch, reader, layout: ParallelLayout, engine_ranks: int, engine_tp: int, versions=(1,), before=None
):
    """Sync `versions` in turn; `before(version, local)` changes a training rank's shards first."""
    locals_, entries = _training_ranks(arch, reader, layout)
    table = build_table(entries, arch, layout, bucket_bytes=96 << 10)  # several buckets
    port, n_train = free_port(), layout.world_size
    world = n_train + engine_ranks
    results: dict = {}
    errors: list = []

    def train(rank: int) -> None:
        bridge = PoolBridge("127.0.0.1", port, rank, world, timeout_s=60)
        sender = PoolSender(
            locals_[rank], table, arch, layout, rank, bridge, engine_ranks, engine_tp, skip_unchanged=True
        )
        out = []
        for v in versions:
            if before is not None:
                before(v, locals_[rank])
            out.append(sender.send(v))
        results[("train", rank)] = out

    def engine(rank: int) -> None:
        bridge = PoolBridge("127.0.0.1", port, n_train + rank, world, timeout_s=60)
        receiver = PoolReceiver(bridge, rank, engine_ranks, engine_tp)
        out = []
        for v in versions:
            stats, tensors = PoolSyncStats(version=v, rank=rank), {}
            for bucket in receiver.buckets(v, stats):
                tensors.update(bucket)
            out.append((stats, tensors))
        results[("engine", rank)] = (out, receiver)

    def guarded(fn, rank):
        try:
            fn(rank)
        except Exception as e:  # surfaced by the test
            errors.append((fn.__name__, rank, e))

    threads = [threading.Thread(target=guarded, args=(train, r)) for r in range(n_train)]
    threads += [threading.Thread(target=guarded, args=(engine, r)) for r in range(engine_ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return table, results


@pytest.mark.parametrize(
    ("tp", "pp", "dp", "engine_ranks", "engine_tp"),
    [(2, 1, 1, 2, 1), (2, 1, 1, 2, 2), (1, 2, 2, 4, 2)],
    ids=["t2-to-2xtp1", "t2-to-tp2", "t1p2d2-to-2xtp2"],
)
def test_each_engine_rank_gets_exactly_its_shard_at_the_floor(tiny, tp, pp, dp, engine_ranks, engine_tp):
    arch, reader = tiny
    layout = ParallelLayout(world_size=tp * pp * dp, tp=tp, pp=pp)
    table, results = _sync(arch, reader, layout, engine_ranks, engine_tp, versions=(1, 1))
    sent = sum(results[("train", r)][0].sent_bytes for r in range(layout.world_size))
    received = 0
    for rank in range(engine_ranks):
        (stats, tensors), (again, nothing) = results[("engine", rank)][0]
        receiver = results[("engine", rank)][1]
        assert stats.received_bytes == stats.floor_bytes == receiver.floor_bytes() > 0
        assert stats.buckets == len(table.buckets) > 1
        assert again.skipped and not nothing and again.received_bytes == 0  # already at version 1
        received += stats.received_bytes
        for p in table.params:
            region = tensors[p.name]
            start, stop = receiver.plan.engine_region(rank, p.kind, p.length)
            dim = shard_dim(p.kind)
            want = reader.get(p.name)
            if dim is not None:
                region, want = region.narrow(dim, start, stop - start), want.narrow(dim, start, stop - start)
            assert torch.equal(region, want), p.name
    assert sent == received  # nothing sent that no engine needed
    assert all(results[("train", r)][1].skipped for r in range(layout.world_size))
    if ParamKind.VOCAB in {ParamKind.of(p.kind) for p in table.params}:
        senders = [r for r in range(layout.world_size) if results[("train", r)][0].sent_bytes]
        assert len(senders) == layout.world_size  # every training rank sends a share


def test_an_fsdp_actor_is_refused_naming_both_keys(tiny_models):
    from types import SimpleNamespace

    from megarl.config.roles import role_spec
    from megarl.config.schema import MegarlConfig
    from megarl.hybrid.pool_sync import PoolSyncError

    cfg = MegarlConfig()
    cfg.model.path, cfg.actor.backend = str(tiny_models["qwen2"]), "fsdp"
    worker = SimpleNamespace(spec=role_spec(cfg, "actor"))  # refused before anything else is read
    with pytest.raises(PoolSyncError) as e:
        PoolSender.join(worker, "127.0.0.1", 0, engine_ranks=2, engine_tp=1)
    assert str(e.value) == (
        "rollout.placement=separate needs actor.backend=megatron (got actor.backend=fsdp): the "
        "shard-to-shard weight sync reads Megatron's TP shards; set actor.backend=megatron or "
        "rollout.placement=colocated"
    )


def test_parameters_unchanged_since_the_last_sync_are_left_out_by_both_pools(tiny):
    arch, reader = tiny
    layout = ParallelLayout(world_size=2, tp=2)
    changed = "decoder.layers.1.mlp.linear_fc2.weight"

    def before(version, local):
        if version == 2:  # an optimizer step that moved one parameter only
            local[changed].add_(1.0)

    table, results = _sync(arch, reader, layout, 2, 1, versions=(1, 2, 3), before=before)
    for rank in range(2):
        (full, _), (second, tensors), (third, nothing) = results[("engine", rank)][0]
        receiver = results[("engine", rank)][1]
        assert full.received_bytes == full.floor_bytes == receiver.floor_bytes()
        assert set(tensors) == {"model.layers.1.mlp.down_proj.weight"}
        assert second.unchanged_tensors == len(table.params) - 1
        down = reader.get("model.layers.1.mlp.down_proj.weight")
        assert second.received_bytes == second.floor_bytes == down.numel() * 4  # all of it: TP1 engines
        assert torch.equal(
            tensors["model.layers.1.mlp.down_proj.weight"],
            reader.get("model.layers.1.mlp.down_proj.weight") + 1,
        )
        assert third.received_bytes == third.floor_bytes == 0 and not nothing and not third.skipped
        assert receiver.version == 3
    assert [s.sent_bytes for s in results[("train", 0)]][2] == 0
