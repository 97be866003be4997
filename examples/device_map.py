"""Placement as code: the actor, the critic and a reward model each on a device of its own (3 CPU process
slots here; "cuda:N" or "node:K/cuda:N" on GPUs). Roles given the same devices would share a pool; a map
that cannot work (a device the cluster lacks, two pools on one device, a layout that does not divide the
devices) is refused before any process starts.

    python examples/device_map.py            # ≈ 2 min on a 2-core CPU (+2 min of SFT the first time)
"""

from __future__ import annotations

from task_rewards import exact_reversal

from megarl import (
    ActorController,
    CriticController,
    DeviceMap,
    PPOTrainer,
    ReferenceController,
    RewardController,
)
from megarl.models.tiny import build_tiny_hf
from megarl.quickstart import prepare, task_config


def main(steps: int = 4, out: str = "outputs/examples/device_map", **keys) -> dict:
    setup = prepare("outputs/examples/task")
    # a stand-in reward model (random weights, the policy's tokenizer): `reward_model.py` trains a real one
    rm_path = build_tiny_hf(f"{out}/reward_model", family="llama", scalar_head=True)
    config = task_config(
        setup, out, **{"trainer.total_steps": steps, "trainer.n_devices_per_node": 3, **keys}
    )
    optimizer = {"lr": 1e-3, "weight_decay": 0.0}
    actor = ActorController(setup.sft_model, optimizer=optimizer, devices=DeviceMap("single", ["cpu:0"]))
    critic = CriticController(optimizer=optimizer, devices=DeviceMap("single", ["cpu:1"]))
    rm = RewardController(rm_path, devices=DeviceMap("single", ["cpu:2"]))
    exact = RewardController(function=exact_reversal, name="exact")
    with (
        actor,
        critic,
        rm,
        PPOTrainer(
            actor=actor,
            critic=critic,
            reference=ReferenceController(),  # in the actor's processes (its devices)
            reward=[(exact, 1.0), (rm, 0.1)],
            config=config,
        ) as trainer,
    ):
        history = trainer.fit()
        pids = {
            name: [p["pid"] for p in c.group.processes]
            for name, c in (("actor", actor), ("critic", critic), ("reward_model", rm))
        }
        return {"history": history, "pids": pids}


if __name__ == "__main__":
    run = main()
    print("processes per role:", run["pids"])
    for h in run["history"]:
        print(
            f"step {h['step']}: reward {h['reward/mean']:.3f} = exact {h['reward/exact/mean']:.3f} + "
            f"0.1 · rm {h['reward/reward_model/mean']:.3f}"
        )
