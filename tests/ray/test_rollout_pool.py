"""A separate rollout pool (issue 42): a TP2 Megatron actor on two ranks sends its weights shard to shard
to engine pools of their own (two TP1 replicas, then one TP2 replica) on one Ray cluster. After each
update + sync, every engine rank received exactly the plan's floor, and the engines' log-probs of their
sampled tokens equal the actor's recomputed ones (fp32) — while before the sync they did not."""

from __future__ import annotations

import time

import pytest
import torch

from megarl.config.roles import role_spec, rollout_spec
from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch
from tests.multiproc.hybrid_checks import N_PROMPTS, PROMPT, RESPONSE, SAMPLES, prompts  # the same prompts

pytestmark = pytest.mark.ray


def config(model: str, engine_tp: int) -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = model, "fp32"
    cfg.data.max_prompt_length, cfg.data.max_response_length = PROMPT, RESPONSE
    cfg.actor.parallel.tp = 2
    cfg.actor.micro_batch_size = 4
    opt = cfg.actor.optimizer
    opt.lr, opt.weight_decay, opt.clip_grad, opt.use_distributed_optimizer = 1e-3, 0.0, 0.0, False
    r = cfg.rollout
    r.tp, r.n, r.temperature, r.seed = engine_tp, SAMPLES, 1.0, 7
    r.kv_cache_memory_bytes, r.max_num_seqs, r.enforce_eager = 16 << 20, 16, True
    r.reshard_bucket_mib = 1  # several buckets: the overlap path runs
    r.sync_skip_unchanged = True  # a sync without an update moves nothing
    cfg.algorithm.ppo_mini_batch_size, cfg.algorithm.ppo_epochs = N_PROMPTS, 1
    return cfg


def mismatch(actor, out: Batch) -> float:
    """max |actor log-prob − engine log-prob| over the sampled tokens."""
    recomputed = actor.log_prob(out)["old_log_probs"]
    return float(((recomputed - out["rollout_log_probs"]).abs() * out["response_mask"]).max())


def update(actor, out: Batch, seed: int) -> None:
    """One optimizer step on random advantages: moves the actor's weights away from the engine's."""
    mask = out["response_mask"]
    old = actor.log_prob(out)["old_log_probs"]
    advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask
    actor.update(out.union(Batch(tensors={"old_log_probs": old, "advantages": advantages})))


def test_separate_pool_takes_the_actors_weights_shard_to_shard(ray_cluster, tiny_models, tmp_path):
    from megarl.controller.resource_pool import ResourcePool
    from megarl.controller.worker_group import RayWorkerGroup
    from megarl.workers.actor import ActorWorker
    from megarl.workers.rollout_worker import RolloutWorker

    model = str(tiny_models["qwen2"])  # q/k/v biases, tied embeddings
    actor_pool = ResourcePool([2], use_gpu=False, name="pool-sync-actor")
    engine_pool = ResourcePool([2], use_gpu=False, name="pool-sync-engine")
    actor = RayWorkerGroup(actor_pool, ActorWorker, "actor", {"spec": role_spec(config(model, 1), "actor")})
    report: dict = {}
    version = 0
    try:
        for engine_tp in (1, 2):
            engines = RayWorkerGroup(
                engine_pool,
                RolloutWorker,
                "rollout",
                {"spec": rollout_spec(config(model, engine_tp))},
                log_dir=tmp_path,
            )
            try:
                host, port = actor.free_port_on_rank0()
                joining = actor.join_bridge_async(host, port, 2, engine_tp)
                joined = engines.join_bridge(host, port, 2)
                joining.result()
                for _ in range(2):
                    before = engines.generate(prompts())
                    update(actor, before, seed=version)
                    stale = mismatch(actor, before)  # the engine still runs the previous weights
                    version += 1
                    start = time.perf_counter()
                    sending = actor.send_weights_async(version)
                    received = engines.receive_weights(version)
                    sent = sending.result()
                    wall = time.perf_counter() - start
                    after = engines.generate(prompts())
                    fresh = mismatch(actor, after)
                    assert stale > 1e-2, (engine_tp, version, stale)
                    assert fresh <= 2e-5, (engine_tp, version, fresh)
                    assert after["rollout_version"].tolist() == [version] * len(after)
                    for got, plan in zip(received, joined):
                        assert got["received_bytes"] == got["floor_bytes"] == plan["floor_bytes"] > 0, got
                        assert got["unchanged_tensors"] == 0  # the update moved every parameter
                    assert sum(s["sent_bytes"] for s in sent) == sum(r["received_bytes"] for r in received)
                    assert all(s["sent_bytes"] > 0 for s in sent)  # both TP ranks send: no broadcaster
                    report[f"tp{engine_tp}_v{version}"] = {
                        "wall_s": wall,
                        "engine_s": [r["seconds"] for r in received],
                        "bytes": [r["received_bytes"] for r in received],
                        "buckets": received[0]["buckets"],
                    }
                # an engine already at the version takes nothing, and the actor sends nothing
                sending = actor.send_weights_async(version)
                assert all(r["skipped"] for r in engines.receive_weights(version))
                assert all(s["skipped"] for s in sending.result())
                # a new version without an update in between: every parameter is unchanged, none travels
                version += 1
                sending = actor.send_weights_async(version)
                received = engines.receive_weights(version)
                assert all(s["sent_bytes"] == 0 for s in sending.result())
                assert all(
                    r["received_bytes"] == r["floor_bytes"] == 0 < r["unchanged_tensors"] for r in received
                )
                assert engines.weights_version() == [version, version]
            finally:
                engines.shutdown()
    finally:
        actor.shutdown()
        actor_pool.remove()
        engine_pool.remove()
    print("pool sync:", report)
