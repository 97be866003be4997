"""A transformers model object and a torch optimizer passed straight in: megarl writes the model where
its ranks read it and maps AdamW's hyper-parameters onto Megatron's optimizer. The same model loaded
from its directory with the same optimizer as a dict gives bit-identical rollouts, log-probs and update.

    python examples/hf_model.py              # ≈ 2 min on a 2-core CPU (+2 min of SFT the first time)
"""

from __future__ import annotations

import torch
from task_rewards import exact_reversal
from transformers import AutoModelForCausalLM, AutoTokenizer

from megarl import ActorController, GRPOTrainer, ReferenceController, RewardController, Stage
from megarl.quickstart import prepare, task_config


def train(actor: ActorController, config: dict) -> tuple[list[dict], list[torch.Tensor]]:
    """The steps' metrics and each step's engine log-probs (a stage after generate keeps them)."""
    log_probs: list[torch.Tensor] = []

    def keep(ctx, batch):
        log_probs.append(batch["rollout_log_probs"].clone())

    with (
        actor,
        GRPOTrainer(
            actor=actor,
            reference=ReferenceController(),
            reward=RewardController(function=exact_reversal),
            config=config,
        ) as trainer,
    ):
        trainer.flow.insert_after("generate", Stage("keep", keep, reads=("rollout_log_probs",)))
        return trainer.fit(), log_probs


def main(steps: int = 2, out: str = "outputs/examples/hf_model", **keys) -> dict:
    setup = prepare("outputs/examples/task")
    model = AutoModelForCausalLM.from_pretrained(setup.sft_model)  # any PreTrainedModel in memory
    tokenizer = AutoTokenizer.from_pretrained(setup.sft_model)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    base = {"trainer.total_steps": steps, "trainer.eval_every": 0, **keys}
    in_memory = train(
        ActorController(model, tokenizer=tokenizer, optimizer=adamw),
        task_config(setup, f"{out}/object", **base),
    )
    as_config = {"lr": 1e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.0}
    from_path = train(
        ActorController(setup.sft_model, optimizer=as_config), task_config(setup, f"{out}/path", **base)
    )
    return {"in_memory": in_memory, "from_path": from_path}


if __name__ == "__main__":
    runs = main()
    (h1, lp1), (h2, lp2) = runs["in_memory"], runs["from_path"]
    for step, (a, b) in enumerate(zip(lp1, lp2), start=1):
        print(f"step {step}: engine log-probs max |Δ| {float((a - b).abs().max()):.2e} (in-memory vs path)")
