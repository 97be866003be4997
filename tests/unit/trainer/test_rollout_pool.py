"""The separate rollout pool's schedule (megarl.trainer.rollout_pool), over recording stand-ins for the two
worker groups that keep Ray's order: one call at a time per group, in submission order, so a batch is
generated with the version the engines hold when its call runs. What is checked is the driver's logic:
which version generates each batch, when syncs happen, the staleness bound, the data position."""

from __future__ import annotations

import pytest
import torch

from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch, Col
from megarl.trainer.rollout_pool import RolloutPool, stale_groups, staleness_metrics


class _Done:
    def __init__(self, value, pending: bool = True) -> None:
        self.value, self.pending = value, pending

    def done(self) -> bool:
        return not self.pending

    def result(self):
        self.pending = False
        return self.value


class _Engines:
    """Generates one row per prompt stamped with the version it holds; takes weights when sent."""

    def __init__(self) -> None:
        self.version = 0  # model.path's weights
        self.log: list[tuple[str, int]] = []

    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        self.log.append(("generate", self.version))
        out = prompts.select([Col.UID])
        out[Col.ROLLOUT_VERSION] = torch.full((len(prompts),), self.version, dtype=torch.long)
        return out

    def generate_async(self, prompts: Batch, validate: bool = False) -> _Done:
        return _Done(self.generate(prompts, validate))

    def receive_weights_async(self, version: int) -> _Done:
        self.log.append(("receive", version))
        self.version = version
        return _Done([{"received_bytes": 10, "floor_bytes": 10}], pending=False)


class _Actor:
    def send_weights_async(self, version: int) -> _Done:
        return _Done([{}], pending=False)


def _pool(max_staleness: int, on_stale: str = "wait") -> tuple[RolloutPool, _Engines, list[int]]:
    cfg = MegarlConfig()
    cfg.async_training.max_staleness = max_staleness
    cfg.async_training.on_stale = on_stale  # type: ignore[assignment]
    engines, drawn = _Engines(), []

    def draw() -> Batch:
        first = len(drawn) * 2
        drawn.append(first)
        batch = Batch({Col.UID: torch.arange(first, first + 2)})
        batch.meta["data_state"] = {"data": {"position": first}, "next_uid": first}
        return batch

    return RolloutPool(cfg, _Actor(), engines, draw), engines, drawn  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_every_batch_is_within_the_bound_and_as_fresh_as_the_schedule_allows(k):
    pool, engines, drawn = _pool(k)
    for step in range(1, 8):
        batch, metrics = pool.batch_for_step(step, pool._draw_prompts())
        lag = (step - 1) - batch[Col.ROLLOUT_VERSION]
        assert int(lag.max()) <= k
        # the step trains its own draw, in data order: uids of the step-th batch drawn
        assert batch[Col.UID].tolist() == [2 * (step - 1), 2 * (step - 1) + 1]
        if k <= 1:  # one batch in flight: exactly the bound once the pipeline is full
            assert metrics["async/staleness_max"] == float(min(k, step - 1))
        # K batches drawn ahead; the checkpoint position is before the oldest not yet trained
        assert len(pool.queue) == k
        assert (pool.data_state() or {"next_uid": 2 * step}).get("next_uid") == 2 * step
    receives = [v for what, v in engines.log if what == "receive"]
    assert receives == sorted(set(receives)), "a version is sent once, in order"


def test_k0_is_the_synchronous_order_sync_then_generate_each_step():
    pool, engines, _ = _pool(0)
    for step in range(1, 4):
        pool.batch_for_step(step, pool._draw_prompts())
    assert engines.log == [  # the engines start with model.path's weights: version 0
        ("generate", 0),
        ("receive", 1),
        ("generate", 1),
        ("receive", 2),
        ("generate", 2),
    ]


def test_validation_after_a_step_uses_that_steps_weights():
    pool, engines, _ = _pool(1)
    pool.batch_for_step(1, pool._draw_prompts())
    pool.generate_now(pool._draw_prompts(), validate=True, version=1)
    assert engines.log[-2:] == [("receive", 1), ("generate", 1)]


def _batch(versions: list[int], uids: list[int]) -> Batch:
    return Batch({Col.UID: torch.tensor(uids), Col.ROLLOUT_VERSION: torch.tensor(versions)})


def test_staleness_metrics_and_stale_groups():
    batch = _batch([3, 3, 2, 1], [7, 7, 8, 8])
    assert stale_groups(batch, trainer_version=3, max_staleness=1) == [8]  # a group goes whole
    m = staleness_metrics(batch, trainer_version=3, max_staleness=2)
    assert m["async/staleness_max"] == 2.0 and m["async/staleness_mean"] == 0.75
    assert [m[f"async/staleness_share_{k}"] for k in range(3)] == [0.5, 0.25, 0.25]


@pytest.mark.parametrize("on_stale", ["drop", "wait"])
def test_groups_past_the_bound_are_dropped_or_generated_again(on_stale):
    pool, engines, _ = _pool(1, on_stale)
    pool.trainer_version, engines.version, pool.engine_version = 3, 3, 3
    prompts = Batch({Col.UID: torch.tensor([7, 8])})
    out = pool._enforce_bound(_batch([3, 3, 1, 1], [7, 7, 8, 8]), prompts)
    if on_stale == "drop":
        assert out[Col.UID].tolist() == [7, 7]
    else:  # group 8 again, now with version 3
        assert out[Col.UID].tolist() == [7, 7, 8]
        assert out[Col.ROLLOUT_VERSION].tolist() == [3, 3, 3]


def test_a_second_call_within_a_step_generates_at_once_and_keeps_the_queue():
    """DAPO's dynamic sampling asks the generate stage for more prompts within the same step."""
    pool, engines, _ = _pool(1)
    pool.batch_for_step(1, pool._draw_prompts())
    queued = [e.step for e in pool.queue]
    extra = pool._draw_prompts()
    more, metrics = pool.batch_for_step(1, extra)
    assert metrics == {} and more[Col.UID].tolist() == extra[Col.UID].tolist()
    assert [e.step for e in pool.queue] == queued  # the draw-ahead queue is untouched
