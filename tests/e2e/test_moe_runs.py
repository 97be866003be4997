"""GRPO with a mixture-of-experts actor end to end: a tiny Qwen3-MoE at expert parallelism 2 on 2 CPU
ranks, the vLLM engine fed by the 3D-HybridEngine (experts repacked on every sync), and the engine's
routes replayed (R3) in the old-log-prob, reference and update forwards. (The quickstart with
`--family qwen3_moe` learns the task: README, "Mixture of experts".)"""

from __future__ import annotations

import math

import pytest

from megarl.models.tiny import build_tiny_hf
from tests.helpers.rl_runs import LOGPROB_TOLERANCE, run, steps

pytestmark = pytest.mark.e2e


def test_an_ep2_moe_actor_trains_on_the_engines_routes(rl_setup, tmp_path):
    moe = build_tiny_hf(tmp_path / "qwen3_moe", "qwen3_moe")
    cfg = rl_setup.grpo_config(
        tmp_path / "run",
        f"model.path={moe}",
        "actor.parallel.ep=2",
        "actor.router_replay.mode=R3",
        "algorithm.old_log_prob=recompute",  # the old-log-prob pass logs the trainer's disagreement
        "trainer.total_steps=2",
        "trainer.eval_every=0",
        "trainer.val_before_train=false",
        # a random model earns no reward (zero advantages): decoupled weight decay still moves every
        # weight, so step 2's engine takes new weights, experts included
        "actor.optimizer.weight_decay=0.1",
    )
    history, _ = run(cfg)
    train = steps(history)
    assert len(train) == 2
    for h in train:  # step 2's engine runs the weights step 1 changed (its experts repacked)
        assert h["train_rollout_logprob_abs_diff_max"] <= LOGPROB_TOLERANCE, h
        assert math.isfinite(h["actor/pg_loss"]) and math.isfinite(h["actor/grad_norm"]), h
        assert h["router_replay/route_bytes"] > 0, h
        # the same fp32 numerics on both sides: the trainer would route as the engine did but at ties
        assert h["router_replay/disagreement_token_share"] <= 0.01, h
        assert h["generate/sync_bytes_over_floor"] == 1.0, h
