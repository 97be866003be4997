"""A reward curriculum: GRPO with partial credit (right digits in the right places) first, then, from
step `switch`, only exact answers count — `set_reward_controller` between two steps.

    python examples/grpo_curriculum.py       # ≈ 3 min on a 2-core CPU (+2 min of SFT the first time)
"""

from __future__ import annotations

from task_rewards import digit_overlap, exact_reversal

from megarl import ActorController, GRPOTrainer, ReferenceController, RewardController
from megarl.quickstart import prepare, task_config


def main(
    steps: int = 16, switch: int = 8, out: str = "outputs/examples/grpo_curriculum", **keys
) -> list[dict]:
    setup = prepare("outputs/examples/task")
    config = task_config(setup, out, **{"trainer.total_steps": steps, "trainer.eval_every": 0, **keys})
    partial = RewardController(function=digit_overlap, name="partial")
    exact = RewardController(function=exact_reversal, name="exact")
    with (
        ActorController(setup.sft_model) as actor,
        GRPOTrainer(actor=actor, reference=ReferenceController(), reward=partial, config=config) as trainer,
    ):
        for step in range(1, steps + 1):
            if step == switch:
                trainer.set_reward_controller(exact)  # the steps from here on score exact answers only
            trainer.step()
        return trainer.history


if __name__ == "__main__":
    for h in main():
        term = "partial" if "reward/partial/mean" in h else "exact"
        print(f"step {h['step']:2d}: reward {h['reward/mean']:.3f} ({term})")
