"""Placement as code: the actor, the reference, the critic and a reward model each on a device of its
own (CPU process slots here; "cuda:N" or "node:K/cuda:N" on GPUs), or, with `colocated=True`, all on one.
Roles given the same devices share a pool; a map that cannot work (a device the cluster lacks, two pools
on one device, a layout that does not divide the devices) is refused before any process starts.
Both placements give the same step-1 metrics, exactly: placement changes where a role runs, not what
it computes.

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
    Roles,
)
from megarl.models.tiny import build_tiny_hf
from megarl.quickstart import prepare, task_config


def main(steps: int = 4, colocated: bool = False, out: str = "outputs/examples/device_map", **keys) -> dict:
    setup = prepare("outputs/examples/task")
    # a stand-in reward model (random weights, the policy's tokenizer): reward_model.py trains a real one
    rm_path = build_tiny_hf(f"{out}/reward_model", family="llama", scalar_head=True)
    out = f"{out}/{'colocated' if colocated else 'separate'}"
    config = task_config(
        setup, out, **{"trainer.total_steps": steps, "trainer.n_devices_per_node": 4, **keys}
    )

    def place(slot: int) -> DeviceMap:
        return DeviceMap("single", ["cpu:0" if colocated else f"cpu:{slot}"])

    optimizer = {"lr": 1e-3, "weight_decay": 0.0}
    actor = ActorController(setup.sft_model, optimizer=optimizer, devices=place(0))
    reference = ReferenceController(devices=place(1))  # on the actor's devices: in the actor's processes
    critic = CriticController(optimizer=optimizer, devices=place(2))
    rm = RewardController(rm_path, devices=place(3))
    exact = RewardController(function=exact_reversal, name="exact")
    roles = Roles(actor, critic, reference, reward_models=[(exact, 1.0), (rm, 0.1)])
    with actor, critic, rm, PPOTrainer(roles=roles, config=config) as trainer:
        history = trainer.fit()
        roles = {"actor": actor, "reference": reference, "critic": critic, "reward_model": rm}
        pids = {name: sorted(p["pid"] for p in c.group.processes) for name, c in roles.items()}
        return {"history": history, "pids": pids}


if __name__ == "__main__":
    run = main()
    print("processes per role:", run["pids"])
    for h in run["history"]:
        print(
            f"step {h['step']}: reward {h['reward/mean']:.3f} = exact {h['reward/exact/mean']:.3f} + "
            f"0.1 · rm {h['reward/reward_model/mean']:.3f}"
        )
