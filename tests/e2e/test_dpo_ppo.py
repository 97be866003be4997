"""DPO beside GRPO in one RL step (megarl.trainer.preference_stage), under Ray on the warm-started tiny
Llama: every step logs the PPO update's `actor/*` metrics and the preference update's `preference/*`,
the preference loss counts for its weight, and the margin of each step's pairs (the correct reversal
over the copied digits, the task's preference.parquet) grows from step to step.

One run of 3 steps (≈ 45 s, most of it starting the workers and the engine). The resume of the pairs'
position is checked without workers (tests/unit/trainer/test_preference_stage.py)."""

from __future__ import annotations

import pytest

from megarl.trainer.preference_stage import add_preference_update
from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.rl_runs import SMALL_STEP
from tests.helpers.run_files import jsonl_history

pytestmark = pytest.mark.e2e

STEPS, PAIRS = 3, 16
PPO = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "reward/mean")
PREFERENCE = (
    "preference/loss",
    "preference/weighted_loss",
    "preference/rewards/accuracy",
    "preference/rewards/margin",
    "preference/logps/chosen",
    "preference/grad_norm",
    "timing/preference_update",
)


def test_each_step_makes_a_grpo_update_and_a_half_weighted_dpo_update(rl_setup, tmp_path):
    out = tmp_path / "run"
    with RLTrainer(rl_setup.grpo_config(out, *SMALL_STEP, f"trainer.total_steps={STEPS}")) as trainer:
        pairs = rl_setup.data / "preference.parquet"
        add_preference_update(trainer, pairs, loss="dpo", beta=0.1, weight=0.5, batch_size=PAIRS)
        history = trainer.fit()
        assert trainer.flow.names[-2:] == ["update_actor", "preference_update"]
        position = trainer.trainer_state()["stages"]["preference_update"]["pairs"]
    assert position["epoch"] == 0 and position["position"] == STEPS * PAIRS  # what a checkpoint keeps

    logged = jsonl_history(out)
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    for h in history:
        for key in PPO + PREFERENCE:
            assert key in h and key in logged[h["step"]], (h["step"], key)
        # the worker sums the backpropagated loss and the preference loss apart: their ratio is the weight
        assert h["preference/weighted_loss"] == pytest.approx(0.5 * h["preference/loss"], rel=1e-9)
        assert h["preference/bad_updates"] == 0 and h["preference/grad_norm"] > 0
    print({k: [round(h[k], 4) for h in history] for k in PPO + PREFERENCE})

    # each step's pairs are new ones, scored before that step's preference update
    margins = [h["preference/rewards/margin"] for h in history]
    accuracy = [h["preference/rewards/accuracy"] for h in history]
    assert margins[0] < margins[1] < margins[2] and margins[2] > margins[0] + 0.1, margins
    assert accuracy[2] > accuracy[0], accuracy
    assert history[2]["preference/loss"] < history[0]["preference/loss"]
