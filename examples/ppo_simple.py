"""PPO with a critic on the quickstart task ("reverse 31594" -> "49513"): an actor, a critic, the frozen
reference and a reward function with verl's signature, on 2 CPU processes.

    python examples/ppo_simple.py            # ≈ 3 min on a 2-core CPU (+2 min of SFT the first time)
"""

from __future__ import annotations

import sys

from task_rewards import exact_reversal  # verl's compute_score signature: 1 for the reversed digits, else 0

from megarl import ActorController, CriticController, PPOTrainer, ReferenceController, RewardController
from megarl.quickstart import prepare, task_config


def main(steps: int = 20, out: str = "outputs/examples/ppo_simple", **keys) -> list[dict]:
    setup = prepare("outputs/examples/task")  # a tiny Llama SFT'd on the task (kept for the next run)
    config = task_config(setup, out, **{"trainer.total_steps": steps, **keys})
    optimizer = {"lr": 1e-3, "weight_decay": 0.0}
    with (
        ActorController(setup.sft_model, optimizer=optimizer) as actor,
        CriticController(optimizer=optimizer) as critic,  # starts from the actor's checkpoint
        PPOTrainer(
            actor=actor,
            critic=critic,
            reference=ReferenceController(),
            reward=RewardController(function=exact_reversal),
            config=config,
        ) as trainer,
    ):
        return trainer.fit()


if __name__ == "__main__":
    history = main()
    val = [h["val/reward/mean"] for h in history if "val/reward/mean" in h]
    print(f"validation accuracy {val[0]:.1%} before PPO -> {val[-1]:.1%} after")
    sys.exit(0 if val[-1] > val[0] else 1)
