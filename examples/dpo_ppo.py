"""DPO+PPO in one flow, a new RL variant built by re-wiring: every step makes the GRPO update on its
rollouts, then a DPO update (weight 0.5 on its loss) on a batch of preference pairs (the correct reversal
over the copied digits), and logs both: actor/* and preference/*.

    python examples/dpo_ppo.py               # ≈ 1 min on a 2-core CPU (+2 min of SFT the first time)
"""

from __future__ import annotations

from task_rewards import exact_reversal

from megarl import ActorController, GRPOTrainer, ReferenceController, RewardController
from megarl.quickstart import prepare, task_config


def main(steps: int = 6, weight: float = 0.5, pairs: int = 16, out: str = "outputs/examples/dpo_ppo", **keys):
    setup = prepare("outputs/examples/task")
    config = task_config(setup, out, **{"trainer.total_steps": steps, **keys})
    reward = RewardController(function=exact_reversal)
    with (
        ActorController(setup.sft_model) as actor,
        GRPOTrainer(actor=actor, reference=ReferenceController(), reward=reward, config=config) as trainer,
    ):
        trainer.add_preference_update(
            setup.data / "preference.parquet", "dpo", weight, beta=0.1, batch_size=pairs
        )
        history = [h for h in trainer.fit() if h["step"] > 0]
        return {"history": history, "stages": trainer.flow.names, "state": trainer.trainer_state()}


if __name__ == "__main__":
    for h in main()["history"]:
        print(
            f"step {h['step']}: reward {h['reward/mean']:.3f} (GRPO), preference loss {h['preference/loss']:.3f}, "
            f"margin {h['preference/rewards/margin']:.3f}, accuracy {h['preference/rewards/accuracy']:.2f} (DPO)"
        )
