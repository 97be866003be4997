"""TRL's GRPOTrainer for `megarl bench e2e`: run inside the TRL venv, never imported by megarl.

    python trl_grpo.py SPEC.json OUT.json

SPEC: {"model", "prompts" [{"prompt": [messages], "ground_truth": str}], "prompts_per_step",
"group_size", "max_new_tokens", "steps", "lr", "seed"}. OUT: per step the wall seconds and their split
(generation = transformers.generate, log_probs = log-prob passes before the loss, reward, update = the
rest of the step: loss forward, backward, optimizer; other = reward and batch preparation), the completion tokens
(in all, and each completion's), and the start-up seconds.

Settings mirror megarl's side of the benchmark: fp32 (bf16 off: TRL turns it on by default, even on
CPU), no gradient checkpointing, beta 0 (no reference model), one policy update per step
(per_device_train_batch_size = prompts × group, steps_per_generation 1, num_iterations 1), HF generate
(use_vllm off), constant learning rate, no shuffling, no reporting.
"""

from __future__ import annotations

import json
import sys
import time

STARTED = time.perf_counter()

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.extras import profiling  # noqa: E402

EVENTS: list[tuple[str, float, float]] = []  # (profiled name, start, end), in order
COMPLETION_LENGTHS: list[list[int]] = []  # per reward call (one per step): each completion's tokens


def _record(self, duration: float) -> None:  # replaces ProfilingContext._log_metrics (wandb/mlflow only)
    end = time.perf_counter()
    EVENTS.append((self.name, end - duration, end))


profiling.ProfilingContext._log_metrics = _record


def exact_match_reward(prompts, completions, ground_truth, completion_ids=None, **kwargs) -> list[float]:
    """Exact match of the completion with the ground truth (what megarl's digit tasks score)."""
    if completion_ids is not None:
        COMPLETION_LENGTHS.append([len(ids) for ids in completion_ids])
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(t.strip() == truth) for t, truth in zip(texts, ground_truth)]


class StepTimes(TrainerCallback):
    def __init__(self) -> None:
        self.steps: list[tuple[float, float]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append((self._start, time.perf_counter()))


def split(start: float, end: float) -> dict[str, float]:
    inside = [(n, s, e) for n, s, e in EVENTS if s >= start and e <= end]

    def total(pred) -> float:
        return sum(e - s for n, s, e in inside if pred(n))

    prepare = [(s, e) for n, s, e in inside if n.endswith("._prepare_inputs")]
    in_prepare = lambda s: any(ps <= s <= pe for ps, pe in prepare)  # noqa: E731
    generation = total(lambda n: ".transformers.generate" in n)  # names are "GRPOTrainer.<block>"
    log_probs = sum(
        e - s for n, s, e in inside if n.endswith("_get_per_token_logps_and_entropies") and in_prepare(s)
    )
    reward = total(lambda n: n.endswith("._calculate_rewards"))
    prepared = sum(e - s for s, e in prepare)
    seconds = end - start
    return {
        "step_seconds": seconds,
        "generation": generation,
        "log_probs": log_probs,
        "reward": reward,
        "transition": 0.0,  # HF generate runs on the training weights: nothing to sync
        "update": seconds - prepared,
        "other": prepared - generation - log_probs,  # reward included, as in megarl's "other"
    }


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    torch.manual_seed(spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    batch = spec["prompts_per_step"] * spec["group_size"]
    args = GRPOConfig(
        output_dir=spec.get("output_dir", "/tmp/megarl-bench-trl"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        beta=0.0,
        num_generations=spec["group_size"],
        max_completion_length=spec["max_new_tokens"],
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        use_vllm=False,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        shuffle_dataset=False,
        max_steps=spec["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=spec["seed"],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    data = Dataset.from_list(spec["prompts"])
    timer = StepTimes()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[exact_match_reward],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    ready = time.perf_counter()
    trainer.train()
    steps = []
    for i, (start, end) in enumerate(timer.steps):
        row = split(start, end)
        lengths = COMPLETION_LENGTHS[i] if i < len(COMPLETION_LENGTHS) else None
        row["completion_tokens"] = sum(lengths) if lengths else None
        row["completion_lengths"] = lengths
        steps.append(row)
    result = {
        "peer": "trl",
        "trl_version": __import__("trl").__version__,
        "transformers_version": __import__("transformers").__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "processes": 1,
        "startup_seconds": ready - STARTED,
        "steps": steps,
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
