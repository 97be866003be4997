"""Two weighted rewards: exact answers (weight 1) plus brevity (weight 0.5); from step `reweigh` on,
brevity weighs 0.1 — `set_multi_reward_controllers` again with other weights, same workers. Each term is
logged as reward/<name>/mean and reward/mean is their weighted sum.

    python examples/multi_objective.py       # ≈ 3 min on a 2-core CPU (+2 min of SFT the first time)
"""

from __future__ import annotations

from task_rewards import brevity, exact_reversal

from megarl import ActorController, GRPOTrainer, ReferenceController, RewardController
from megarl.quickstart import prepare, task_config

WEIGHTS = [{"exact": 1.0, "brevity": 0.5}, {"exact": 1.0, "brevity": 0.1}]


def main(
    steps: int = 12, reweigh: int = 6, out: str = "outputs/examples/multi_objective", **keys
) -> list[dict]:
    setup = prepare("outputs/examples/task")
    config = task_config(setup, out, **{"trainer.total_steps": steps, "trainer.eval_every": 0, **keys})
    exact = RewardController(function=exact_reversal, name="exact")
    short = RewardController(function=brevity, name="brevity")
    with (
        ActorController(setup.sft_model) as actor,
        GRPOTrainer(actor=actor, reference=ReferenceController(), reward=exact, config=config) as trainer,
    ):
        for step in range(1, steps + 1):
            weights = WEIGHTS[0] if step < reweigh else WEIGHTS[1]
            trainer.set_multi_reward_controllers([(exact, weights["exact"]), (short, weights["brevity"])])
            trainer.step()
        return trainer.history


if __name__ == "__main__":
    for h in main():
        print(
            f"step {h['step']:2d}: reward {h['reward/mean']:.3f} = exact {h['reward/exact/mean']:.3f} "
            f"+ w · brevity {h['reward/brevity/mean']:.3f}"
        )
