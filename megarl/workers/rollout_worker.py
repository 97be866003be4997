"""RolloutWorker: one rank of a separate rollout pool (rollout.placement=separate), on its own devices.

    generate(prompts, validate=False)  -> rollout Batch (+ rollout_version [n] long), GEN_DP_COMPUTE:
                                          each engine replica samples its share, TP rank 0 returns it
    join_bridge(host, port, n_train)   -> {engine_rank, floor_bytes, ...}: join the weight bridge
                                          (collective with the actor's join_bridge)
    receive_weights(version)           -> this rank's PoolSyncStats report (collective with the actor's
                                          send_weights(version)); a no-op when already at ≥ version
    weights_version()                  -> the version the engine runs (0: model.path's weights)

The pool is its own torch.distributed world (gloo on CPU) of rollout.n_devices ranks; the engines are
in-process vLLM replicas over consecutive runs of rollout.tp ranks, starting from model.path. New weights
come shard to shard from the actor's training ranks (megarl.hybrid.pool_sync), never through the driver.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from megarl.config.roles import RoleSpec, RolloutSpec
from megarl.controller.dispatch import Dispatch, RankInfo, register
from megarl.controller.worker import Worker
from megarl.distributed.backend import collective_timeout
from megarl.errors import MegarlError
from megarl.protocol import Batch, Col

if TYPE_CHECKING:
    from megarl.hybrid.pool_sync import PoolReceiver


class RolloutWorker(Worker):
    role = "rollout"

    def __init__(self, spec: RoleSpec | RolloutSpec) -> None:
        rollout = spec if isinstance(spec, RolloutSpec) else spec.rollout
        if rollout is None:
            raise MegarlError("the rollout pool needs the actor's rollout spec (role_spec(cfg, 'actor'))")
        super().__init__()
        self.rollout_spec = rollout
        self.tp = rollout.rollout.tp
        world = self.env.world_size
        if world % self.tp:
            raise MegarlError(
                f"rollout.n_devices={world} must be a multiple of rollout.tp={self.tp} (the engines run in "
                "consecutive TP groups)"
            )
        from megarl.rollout.vllm import VLLMRollout

        self.engine = VLLMRollout(rollout)
        self.version = 0  # model.path's weights
        self.receiver: PoolReceiver | None = None  # once join_bridge ran
        self.partial = rollout.partial_rollout
        self.sync_reports: list[dict] = []  # the syncs taken during the current generate call
        self._last_report: dict = {}
        # a partial rollout's decision to take new weights mid-generation, made by each engine replica's
        # TP rank 0 and broadcast to its other ranks (they step in lockstep and must load together)
        self.replica_group = None
        if self.partial and self.tp > 1:
            import torch.distributed as dist

            for first in range(0, world, self.tp):  # every rank creates every group, in order
                group = dist.new_group(list(range(first, first + self.tp)), timeout=collective_timeout())
                if first <= self.env.rank < first + self.tp:
                    self.replica_group, self.replica_leader = group, first

    def rank_info(self) -> RankInfo:
        replica, tp_rank = divmod(self.env.rank, self.tp)
        replicas = self.env.world_size // self.tp
        return RankInfo(
            rank=self.env.rank,
            dp_rank=replica,
            dp_size=replicas,
            collect=tp_rank == 0,
            gen_dp_rank=replica,
            gen_dp_size=replicas,
            gen_collect=tp_rank == 0,
        )

    @register(Dispatch.GEN_DP_COMPUTE)
    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        """Sample responses for this engine replica's share of `prompts` (rollout.* sampling, or
        rollout.val.* when `validate`) with the weights of `weights_version()`."""
        r = self.rollout_spec.rollout
        start = time.perf_counter()
        sampling = r.val if validate else r
        self.sync_reports = []
        if self.partial and not validate and self.receiver is not None:
            # async_training.partial_rollout: weights sent meanwhile are taken between two engine steps
            self.engine.weights_version = self.version
            out = self.engine.generate(
                prompts, sampling, self.engine.has_log_probs, between_steps=self._new_weights
            )
        else:
            out = self.engine.generate(prompts, sampling, self.engine.has_log_probs)
            out[Col.ROLLOUT_VERSION] = torch.full((len(out),), self.version, dtype=torch.long)
            if self.partial:  # the same columns as the partial path's, every token of this version
                real = out[Col.RESPONSE_MASK] > 0
                out[Col.ROLLOUT_TOKEN_VERSIONS] = torch.where(real, self.version, -1).long()
        out.meta["rollout_pool"] = {
            "version": self.version,
            "seconds": time.perf_counter() - start,
            "sync": self.sync_reports,  # taken mid-generation (partial rollouts)
        }
        return out

    def _new_weights(self) -> int | None:
        """Between two engine steps of a partial rollout: take the weights the actor is sending now, if
        any (its rank 0 announced the version on the bridge before sending); the version, or None."""
        assert self.receiver is not None
        pending = self.receiver.bridge.pending_version()
        if self.replica_group is not None:
            import torch.distributed as dist

            flag = torch.tensor([-1 if pending is None else pending], dtype=torch.long)
            dist.broadcast(flag, src=self.replica_leader, group=self.replica_group)
            pending = None if int(flag) < 0 else int(flag)
        if pending is None or pending <= self.version:
            return None
        self.receive_weights(pending)
        self.sync_reports.append(self._last_report)
        return self.version

    @register(Dispatch.ONE_TO_ALL)
    def join_bridge(self, host: str, port: int, n_train: int) -> dict:
        """Join the weight bridge as bridge rank n_train + this rank (collective with the actor's
        join_bridge), and read the actor's parameter table."""
        from megarl.hybrid.pool_bridge import PoolBridge
        from megarl.hybrid.pool_sync import PoolReceiver

        if self.receiver is not None:
            self.receiver.close()
        world = self.env.world_size
        bridge = PoolBridge(
            host, port, n_train + self.env.rank, n_train + world, collective_timeout().total_seconds()
        )
        receiver = PoolReceiver(bridge, self.env.rank, world, self.tp)
        receiver.version = self.version
        self.receiver = receiver
        return {
            "engine_rank": self.env.rank,
            "floor_bytes": receiver.floor_bytes(),
            "tensors": len(receiver.table.params),
            "buckets": len(receiver.table.buckets),
        }

    @register(Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int) -> dict:
        """Take the actor's weights of `version` into the engine (collective with the actor's
        send_weights(version)); returns this rank's report: bytes received vs the floor, seconds."""
        from megarl.hybrid.pool_sync import PoolSyncError, PoolSyncStats

        if self.receiver is None:
            raise PoolSyncError("receive_weights before join_bridge: call join_bridge on both pools first")
        stats = PoolSyncStats(version=version, rank=self.env.rank)
        for bucket in self.receiver.buckets(version, stats):
            self.engine.load_weights(bucket)
        if not stats.skipped:
            self.version = version
        self._last_report = stats.report()
        return self._last_report

    @register(Dispatch.ONE_TO_ALL)
    def weights_version(self) -> int:
        return self.version

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        self.engine.close()  # vLLM's groups go before the default one
        super().shutdown()
