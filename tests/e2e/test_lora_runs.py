"""LoRA end to end: GRPO on the quickstart task with adapters only (rank 16), the engine served the
current adapter from memory every step, the reference is the actor with its adapters off, the PEFT export
answers as the engine did, and a run resumed from an adapter checkpoint continues bit-exactly."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.rl_runs import GRPO, LOGPROB_TOLERANCE, assert_same_metrics, run, steps

pytestmark = pytest.mark.e2e

# verl's LoRA guide: about 10× full training's learning rate (the quickstart trains the whole tiny model
# at 1e-3)
LORA = (
    "actor.lora.rank=16",
    "actor.lora.alpha=32",
    "actor.optimizer.lr=1e-2",
    "actor.lora.check_sync=true",
)


@dataclass(frozen=True)
class LoraRun:
    cfg: object
    history: list
    out: Path
    reference_is_actor: bool


@pytest.fixture(scope="session")
def lora_run(rl_setup, tmp_path_factory) -> LoraRun:
    """12 GRPO steps of 32 prompts × 8 samples with LoRA, validated before and after, saved at step 6 and
    12, the final actor exported (PEFT adapter + merged HF model)."""
    out = tmp_path_factory.mktemp("lora")
    cfg = rl_setup.grpo_config(
        out,
        *GRPO,
        *LORA,
        "trainer.total_steps=12",
        "trainer.eval_every=12",
        f"trainer.validation_data_dir={out / 'validation'}",
        "trainer.save_every=6",
        "trainer.save_hf=true",
    )
    with RLTrainer(cfg) as trainer:
        history = trainer.fit()
        reference_is_actor = trainer.roles.ref is trainer.roles.actor
    return LoraRun(cfg, history, out, reference_is_actor)


def test_lora_grpo_learns_with_the_engine_serving_the_current_adapter(lora_run):
    history = lora_run.history
    val = [h["val/reward/mean"] for h in history if "val/reward/mean" in h]
    assert len(val) == 2 and val[1] > val[0] + 0.05, val
    train = steps(history)
    assert len(train) == 12
    for h in train:
        # the engine's log-probs are the trainer's: it served this step's adapter, not an older one
        assert h["train_rollout_logprob_abs_diff_max"] <= LOGPROB_TOLERANCE, h
        assert h["generate/sync_adapter_bytes"] > 0 and h["generate/sync_bytes_over_floor"] == 1.0, h
    # step 1: adapters start with B = 0 and the reference is the actor with them off, so the KL of the
    # first update's (only) mini-batch is exactly zero: both forwards are bitwise the base model
    assert train[0]["actor/kl_loss"] == 0.0
    assert train[1]["actor/kl_loss"] > 0.0


def test_the_reference_is_the_actor_and_checkpoints_hold_only_the_adapters(lora_run):
    assert lora_run.reference_is_actor  # the run's reference handle is the actor's group: no second model
    model_dir = lora_run.out / "checkpoints" / "step_6" / "actor" / "model"
    written = sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())
    base = sum(f.stat().st_size for f in Path(lora_run.cfg.model.path).glob("*.safetensors"))
    assert written < base / 5, (written, base)


def test_the_peft_export_answers_as_the_trainers_engine_did(lora_run, rl_setup):
    """<run>/hf/adapter loads with peft on the transformers model and answers the validation prompts
    greedily, token for token as the trainer's engine did after step 12."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    records = [
        json.loads(line) for line in (lora_run.out / "validation" / "step_12.jsonl").read_text().splitlines()
    ]
    base = AutoModelForCausalLM.from_pretrained(rl_setup.sft_model, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, lora_run.out / "hf" / "adapter").eval()
    eos = base.generation_config.eos_token_id
    for r in records:
        prompt = torch.tensor([r["input_ids"]])
        with torch.no_grad():
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=lora_run.cfg.data.max_response_length,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        assert out[0, prompt.shape[1] :].tolist() == r["output_ids"], r


def test_a_run_resumed_from_an_adapter_checkpoint_continues_bit_exactly(lora_run, rl_setup, tmp_path):
    cfg = rl_setup.grpo_config(
        tmp_path,
        *GRPO,
        *LORA,
        "trainer.total_steps=7",
        "trainer.eval_every=0",
        "trainer.val_before_train=false",
        f"trainer.resume={lora_run.out / 'checkpoints' / 'step_6'}",
    )
    history, _ = run(cfg)
    resumed = {h["step"]: h for h in steps(history)}
    assert list(resumed) == [7]
    original = {h["step"]: h for h in steps(lora_run.history)}
    compared = assert_same_metrics(original[7], resumed[7])
    assert "actor/pg_loss" in compared and "reward/mean" in compared


def test_a_run_started_from_the_exported_peft_adapter_validates_as_the_trained_actor(
    lora_run, rl_setup, tmp_path
):
    """actor.lora.adapter_path: the run's PEFT export loaded as the starting adapter (trainer.val_only)
    answers the validation prompts token for token as the trained actor's engine did after step 12."""
    cfg = rl_setup.grpo_config(
        tmp_path,
        *LORA,
        f"actor.lora.adapter_path={lora_run.out / 'hf' / 'adapter'}",
        "trainer.val_only=true",
        f"trainer.validation_data_dir={tmp_path / 'validation'}",
    )
    run(cfg)

    def outputs(path: Path) -> list:
        return [json.loads(line)["output_ids"] for line in path.read_text().splitlines()]

    trained = outputs(lora_run.out / "validation" / "step_12.jsonl")
    assert outputs(tmp_path / "validation" / "step_0.jsonl") == trained
