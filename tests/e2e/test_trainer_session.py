"""The RL trainer as a reusable object (under Ray): steps one at a time, then a `fit` past the configured
total on the same workers, and `close` ending every worker process."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.rl_runs import SMALL_STEP

pytestmark = pytest.mark.e2e

CHEAP = (*SMALL_STEP, "trainer.total_steps=3")  # fit(total_steps=5) goes past it


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_three_steps_then_fit_to_five_on_the_same_workers_and_close_ends_them(rl_setup, tmp_path):
    out = tmp_path / "run"
    trainer = RLTrainer(rl_setup.grpo_config(out, *CHEAP))
    pids = [p["pid"] for p in trainer.roles.actor.processes]  # the reference lives in the same processes
    assert pids and all(_alive(pid) for pid in pids)

    stepped = [trainer.step() for _ in range(3)]
    assert all("reward/mean" in m and "actor/pg_loss" in m for m in stepped)
    assert trainer.total_steps == 3 and not (out / "summary.json").exists()  # step() writes no summary

    history = trainer.fit(total_steps=5)  # steps 4 and 5 only
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5]
    assert [{k: v for k, v in h.items() if k != "step"} for h in history[:3]] == stepped
    assert [p["pid"] for p in trainer.roles.actor.processes] == pids  # no worker restarted
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4, 5]
    assert json.loads((out / "summary.json").read_text())["steps"] == 5

    trainer.close()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in pids if _alive(pid)] == []
    trainer.close()  # a second close does nothing
    assert not trainer.roles.actor.alive and trainer.log.sinks == []
