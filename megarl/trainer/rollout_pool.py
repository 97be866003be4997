"""The driver's side of a separate rollout pool (rollout.placement=separate): when the engines get new
weights, what they generate next, and which batch each training step takes (async_training).

    pool = RolloutPool(cfg, roles.actor, roles.rollout, draw=trainer.next_prompts)
    pool.connect()                          # the weight bridge between the two pools (once)
    batch = pool.batch_for_step(step, prompts)   # the generate stage of every step
    rollouts = pool.generate_now(prompts, validate=True)   # validation: the newest weights, waited for

Versions: the weights after v training steps are version v (0: model.path's, which the engines start
from); the engines hold one version at a time
and stamp each row with the version of its oldest token (`rollout_version`). At step s the trainer's
weights are version s-1, so a row's staleness is (s-1) - rollout_version; `async_training.max_staleness`
= K bounds it. The pool keeps K+1 prompt batches drawn (the one this step trains and K ahead), in data
order, and hands a batch to the engines as soon as the engines' version is new enough for the step
that will train it (version ≥ that step's trainer version - K): the engines generate the next batches
while the actor trains. A sync is made only when a batch needs newer weights than the engines hold;
without partial rollouts it waits for the engines' current batch (Ray runs one call at a time per
rank), with them the engines take the weights between two engine steps and continue their requests.
K=0 is the synchronous loop: sync, generate, train — the colocated run's order and seeds.

The draws ahead are the trainer's own (`draw`: data order, uids and the data position are the
trainer's); a checkpoint records the data position before the oldest batch not yet trained
(`data_state`), so a resumed run draws those prompts again and generates them with its current weights:
no prompt is trained twice or skipped, and the bound holds across resume.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from megarl.config.schema import MegarlConfig
from megarl.controller.group import GroupFuture
from megarl.protocol import Batch, Col
from megarl.workers.groups import ActorGroup, RolloutGroup


@dataclass
class _Draw:
    """One drawn prompt batch on its way to training: submitted to the engines once its version allows."""

    prompts: Batch
    step: int  # the training step that takes it
    data_state: dict[str, Any]  # the trainer's data position before this draw (meta["data_state"])
    future: GroupFuture[Batch] | None = None


@dataclass
class _StepTimes:
    """Where the driver's time went during one step, for the busy shares."""

    waited: float = 0.0  # blocked on generation (the trainer idle)
    sync: float = 0.0
    generated: float = 0.0  # engine seconds of the batches received this step
    syncs: int = 0
    sync_stats: list[dict] = field(default_factory=list)


def staleness(batch: Batch, trainer_version: int) -> torch.Tensor:
    """Per row: how many versions the row's oldest token lags behind the trainer's weights."""
    return trainer_version - batch[Col.ROLLOUT_VERSION].long()


def stale_groups(batch: Batch, trainer_version: int, max_staleness: int) -> list[int]:
    """The uids of the groups with a row past `max_staleness` (a group is trained whole or not at all)."""
    late = staleness(batch, trainer_version) > max_staleness
    return sorted({int(u) for u in batch[Col.UID][late].tolist()})


def staleness_metrics(batch: Batch, trainer_version: int, max_staleness: int) -> dict[str, float]:
    """async/staleness_{mean,max} and the histogram async/staleness_share_<k> (share of rows at k)."""
    lag = staleness(batch, trainer_version).float()
    out = {"async/staleness_mean": lag.mean().item(), "async/staleness_max": lag.max().item()}
    for k in range(max_staleness + 1):
        out[f"async/staleness_share_{k}"] = (lag == k).float().mean().item()
    return out


class RolloutPool:
    def __init__(
        self,
        cfg: MegarlConfig,
        actor: ActorGroup,
        rollout: RolloutGroup,
        draw: Callable[[], Batch],
    ) -> None:
        a = cfg.async_training
        self.max_staleness, self.on_stale, self.partial = a.max_staleness, a.on_stale, a.partial_rollout
        self.actor, self.rollout = actor, rollout
        self._draw_prompts = draw  # the trainer's next prompts, meta["data_state"] = the position before
        self.engine_version = 0  # the engines start from model.path: the weights before any step
        self.trainer_version = 0
        self.queue: deque[_Draw] = deque()
        self._times = _StepTimes()
        self._served_step: int | None = None
        self._late = 0

    # ---- the training step's batch -------------------------------------------------------------------

    def batch_for_step(self, step: int, prompts: Batch) -> tuple[Batch, dict[str, float]]:
        """The rollouts step `step` trains (of the oldest prompts drawn, which `prompts` — this step's
        draw — joins at the back), with the step's async metrics. A second call within one step (DAPO's
        dynamic sampling asking for more) generates `prompts` at once with the engines' weights."""
        if self._served_step == step:
            return self.generate_now(prompts), {}
        self._served_step = step
        self.trainer_version = step - 1
        self._append(prompts, self.queue[-1].step + 1 if self.queue else step)
        while len(self.queue) < self.max_staleness + 1:  # the first step (or a resumed run's) draws ahead
            self._append(self._draw_prompts(), self.queue[-1].step + 1)
        self._submit_ready()
        head = self.queue[0]
        if head.future is None:  # it needs newer weights than the engines hold: sync, waiting if need be
            self._sync()
            self._submit_ready()
        assert head.step == step and head.future is not None
        waited = time.perf_counter()
        batch = head.future.result()
        self._times.waited += time.perf_counter() - waited
        self.queue.popleft()
        self._absorb(batch)
        batch = self._enforce_bound(batch, head.prompts)
        self._submit_ready()  # the engines are free for the next batch now
        return batch, self._step_metrics(batch)

    def generate_now(self, prompts: Batch, validate: bool = False, version: int | None = None) -> Batch:
        """Rollouts of `prompts` with the trainer's newest weights (`version`: the weights after that many
        steps; default the current), waited for: validation (after step s: version s), DAPO's extra
        prompts, groups generated again. The engines finish what they have queued first."""
        if version is not None:
            self.trainer_version = max(self.trainer_version, version)
        self._sync()
        start = time.perf_counter()
        batch = self.rollout.generate(prompts, validate=validate)
        if not validate:
            self._times.waited += time.perf_counter() - start
            self._absorb(batch)
        batch.meta.pop("rollout_pool", None)
        return batch

    def _append(self, prompts: Batch, step: int) -> None:
        state = prompts.meta.pop("data_state", None)
        if state is None:
            raise ValueError(
                "the pool's prompt batches need meta['data_state'] (RLTrainer.next_prompts sets it)"
            )
        self.queue.append(_Draw(prompts, step, state))

    def _submit_ready(self) -> None:
        """Hand the engines every drawn batch, in order, whose training step accepts their version: the
        batch trained at step t needs version ≥ t-1-max_staleness."""
        for entry in self.queue:
            if entry.future is not None:
                continue
            needed = entry.step - 1 - self.max_staleness
            if self.engine_version < needed:
                if needed > self.trainer_version:
                    return  # the weights it needs do not exist yet
                if not self.partial and any(e.future is not None and not e.future.done() for e in self.queue):
                    return  # a sync now would wait for the engines' current batch: at the next call
                self._sync()
            entry.future = self.rollout.generate_async(entry.prompts)

    def _sync(self) -> None:
        """Send the trainer's weights to the engines (shard to shard), unless they have them already."""
        version = self.trainer_version
        if self.engine_version >= version:
            return
        start = time.perf_counter()
        sent = self.actor.send_weights_async(version)
        received = self.rollout.receive_weights_async(version)
        # with partial rollouts the engines take the weights between two engine steps of a running
        # batch (the sender returns once they have them); the receive call queued behind that batch
        # then finds them in place and returns
        stats = received.result() if not self.partial else None
        sent.result()
        self._times.sync += time.perf_counter() - start
        self._times.syncs += 1
        if stats:
            self._times.sync_stats = [s for s in stats if s]
        self.engine_version = version

    def _absorb(self, batch: Batch) -> None:
        report = batch.meta.pop("rollout_pool", None)
        if report is not None:
            self._times.generated += float(report.get("seconds", 0.0))
            stats = report.get("sync")
            if stats:
                self._times.sync_stats = list(stats)

    def _enforce_bound(self, batch: Batch, prompts: Batch) -> Batch:
        """async_training.on_stale for groups past max_staleness (only partial rollouts carried across
        more syncs than the bound allows can produce them): drop them, or generate them again now."""
        late = set(stale_groups(batch, self.trainer_version, self.max_staleness))
        self._late = len(late)
        if not late:
            return batch
        keep = [i for i, u in enumerate(batch[Col.UID].tolist()) if int(u) not in late]
        if self.on_stale == "drop":
            if not keep:
                raise RuntimeError(
                    f"every group of step {self._served_step} is past async_training.max_staleness="
                    f"{self.max_staleness}; nothing is left to train"
                )
            return batch[keep]
        again = [i for i, u in enumerate(prompts[Col.UID].tolist()) if int(u) in late]
        fresh = self.generate_now(prompts[again])
        return Batch.concat([batch[keep], fresh]) if keep else fresh

    def _step_metrics(self, batch: Batch) -> dict[str, float]:
        times, self._times = self._times, _StepTimes()
        metrics = staleness_metrics(batch, self.trainer_version, self.max_staleness)
        if Col.ROLLOUT_TOKEN_VERSIONS in batch:  # partial rollouts: responses that span a weight sync
            versions = batch[Col.ROLLOUT_TOKEN_VERSIONS].long()
            newest = versions.max(dim=-1).values
            oldest = torch.where(versions < 0, newest[:, None], versions).min(dim=-1).values
            metrics["async/spanning_sync_share"] = (newest > oldest).float().mean().item()
        metrics.update(
            {
                "async/engine_version": float(self.engine_version),
                "async/queued_batches": float(sum(e.future is not None for e in self.queue)),
                "async/stale_groups": float(self._late),
                "async/wait_seconds": times.waited,
                "async/sync_seconds": times.sync,
                "async/syncs": float(times.syncs),
                "async/engine_generate_seconds": times.generated,
            }
        )
        if times.sync_stats:
            received = [s.get("received_bytes", 0) for s in times.sync_stats]
            floor = [s.get("floor_bytes", 0) for s in times.sync_stats]
            metrics["async/sync_received_bytes_per_engine_rank"] = float(max(received))
            metrics["async/sync_bytes_over_floor"] = (
                max(r / f for r, f in zip(received, floor)) if all(floor) else 1.0
            )
        return metrics

    # ---- checkpoints ---------------------------------------------------------------------------------

    def data_state(self) -> dict[str, Any] | None:
        """The data position before the oldest drawn batch not yet trained (None: nothing drawn ahead)."""
        return self.queue[0].data_state if self.queue else None

    def drain(self) -> None:
        """Wait for every batch the engines are generating (before the run ends or the pools stop)."""
        for entry in self.queue:
            if entry.future is not None:
                try:
                    entry.future.result()
                except Exception:  # the run is ending; its own error is the one to report
                    pass
        self.queue.clear()
