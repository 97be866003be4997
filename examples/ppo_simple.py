"""PPO with a critic on the quickstart task ("reverse 31594" -> "49513"): an actor, a critic, the frozen
reference and a reward function with verl's signature, on 2 CPU processes. It is the README's Python API
example, verbatim (CI runs the README's text and checks that this file holds it).

    python examples/ppo_simple.py            # ≈ 1 min on a 2-core CPU (+2 min of SFT the first time)
"""

from megarl import ActorController, CriticController, PPOTrainer, ReferenceController, RewardController
from megarl.quickstart import prepare


def exact(data_source, solution_str, ground_truth, extra_info=None):  # verl's compute_score signature
    return float(solution_str.strip() == ground_truth)


task = prepare("outputs/examples/task")  # the quickstart's tiny Llama, SFT'd on its digit task (kept)
actor = ActorController(task.sft_model, optimizer={"lr": 1e-3, "weight_decay": 0.0})
critic = CriticController(optimizer={"lr": 1e-3})  # starts from the actor's checkpoint, a new value head
trainer = PPOTrainer(
    actor=actor,
    critic=critic,
    reference=ReferenceController(),  # the actor's starting weights, frozen: the KL term
    reward=RewardController(function=exact),
    config="configs/quickstart_grpo.yaml",  # or a dict, or a MegarlConfig; checked as the CLI checks it
    overrides={
        "data.train_files": task.train_files,
        "data.val_files": task.val_files,
        "trainer.total_steps": 10,
        "trainer.output_dir": "outputs/ppo",
    },
)
first = trainer.step()  # one step's metrics
history = trainer.fit()  # the rest, with progress; checkpoints and resume as the CLI's
trainer.close(), actor.close(), critic.close()  # or `with` each: the controllers own their workers
val = [h["val/reward/mean"] for h in history if "val/reward/mean" in h]  # greedy, before and after
print(f"step 1: reward {first['reward/mean']:.2f}; greedy val reward {val[0]:.2f} -> {val[-1]:.2f}")
