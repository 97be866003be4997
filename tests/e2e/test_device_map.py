"""Placement by device map (under Ray): the same PPO step with the critic colocated with the actor, and
with the critic and the reference on a device of their own, gives the same step-1 metrics."""

from __future__ import annotations

import pytest

from megarl.config.placement import placement
from tests.helpers.rl_runs import SMALL_STEP, assert_same_metrics, run, steps

pytestmark = pytest.mark.e2e

# PPO with a critic (gae) and the quickstart's KL loss (so the reference runs), one small step, on a
# 1 × 2 cluster of CPU process slots
PPO_STEP = (
    *SMALL_STEP,
    "algorithm.name=ppo",
    "algorithm.adv_estimator=gae",
    "critic.micro_batch_size=8",
    "trainer.total_steps=1",
    "trainer.n_devices_per_node=2",
)


def test_colocated_and_separate_pools_give_the_same_step_one_metrics(rl_setup, tmp_path):
    """Every rank runs with one thread and the same layout (TP1 × DP1 per role) on the same weights (the
    critic's fresh value head drawn from trainer.seed), on the same micro-batches: the same operations in
    the same order wherever a role's process runs, so the metrics are compared exactly."""
    colocated = rl_setup.grpo_config(
        tmp_path / "colocated", *PPO_STEP, "actor.devices=[cpu:0]", "critic.devices=[cpu:0]"
    )
    separate = rl_setup.grpo_config(
        tmp_path / "separate",
        *PPO_STEP,
        "actor.devices=[cpu:0]",
        "critic.devices=[cpu:1]",
        "ref.devices=[cpu:1]",  # the reference leaves the actor's processes: its own group beside the critic
    )
    pools = [
        [(p.roles, [str(d) for d in p.devices]) for p in placement(c).pools] for c in (colocated, separate)
    ]
    assert pools == [
        [(("actor", "ref", "critic"), ["cpu:0"])],
        [(("actor",), ["cpu:0"]), (("ref", "critic"), ["cpu:1"])],
    ]

    expected, _ = run(colocated)
    actual, _ = run(separate)
    assert len(steps(expected)) == len(steps(actual)) == 1
    compared = assert_same_metrics(steps(expected)[0], steps(actual)[0])
    assert {"critic/value_loss", "actor/pg_loss", "actor/kl_loss", "reward/mean"} <= set(compared)
    # before its first update the policy is the reference: a KL of exactly 0 says the reference's own group
    # gave the log-probs the actor's processes give, bit for bit
    assert steps(actual)[0]["actor/kl_loss"] == 0.0
    logs = sorted(p.name for p in (tmp_path / "separate" / "logs").iterdir())
    assert logs == ["actor_rank0.log", "critic_rank0.log", "ref_rank0.log"]
