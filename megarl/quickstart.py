"""`megarl quickstart`: train a tiny model with RL on a CPU and show that it learned.

1. build a tiny Llama offline (random weights, locally trained tokenizer);
2. write the `digits_reverse` task ("reverse 31594" -> "49513") in verl's parquet schema, with a
   deliberately imperfect warm-start set: half of its answers copy the digits instead of reversing them;
3. SFT warm-start on it (configs/quickstart_sft.yaml): the model now answers in the task's format, but
   reverses only part of the time;
4. GRPO (configs/quickstart_grpo.yaml) with the exact-match reward through the 3D-HybridEngine (vLLM
   rollout), 2 CPU processes: greedy validation accuracy before and after.
Writes `<out>/summary.json` (and the runs' metrics.jsonl); exits 1 if accuracy did not improve.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TASK = "digits_reverse"


def _step(n: int, text: str) -> float:
    print(f"[{n}/4] {text}", flush=True)
    return time.perf_counter()


def quickstart_overrides(out: Path, seed: int) -> tuple[list[str], list[str]]:
    """(SFT overrides, GRPO overrides) pointing the two configs at the run's directories."""
    data = out / "data"
    sft = [
        f"model.path={out / 'models' / 'llama'}",
        f"data.train_files=[{data / 'sft.parquet'}]",
        f"trainer.output_dir={out / 'sft'}",
        f"trainer.seed={seed}",
        f"data.seed={seed}",
    ]
    grpo = [
        f"model.path={out / 'sft' / 'hf'}",
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'val.parquet'}]",
        f"trainer.output_dir={out / 'grpo'}",
        f"trainer.seed={seed}",
        f"data.seed={seed}",
    ]
    return sft, grpo


def run_quickstart(out: Path, seed: int = 0, grpo_steps: int | None = None) -> int:
    from megarl.config import load_config
    from megarl.data.tasks import make_task
    from megarl.models.tiny import build_tiny_hf
    from megarl.trainer.rl_trainer import RLTrainer
    from megarl.trainer.sft import SFTTrainer

    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    sft_overrides, grpo_overrides = quickstart_overrides(out, seed)
    if grpo_steps is not None:
        grpo_overrides.append(f"trainer.total_steps={grpo_steps}")

    start = _step(1, f"building a tiny Llama under {out}/models")
    build_tiny_hf(out / "models" / "llama", family="llama", seed=seed)
    print(f"      done in {time.perf_counter() - start:.1f}s")

    start = _step(2, f"writing the {TASK} task (warm-start answers: half copy the input) under {out}/data")
    make_task(TASK, out / "data", seed=seed, sft_noise=0.5)
    print(f"      done in {time.perf_counter() - start:.1f}s")

    start = _step(3, "SFT warm-start (configs/quickstart_sft.yaml)")
    with SFTTrainer(load_config(CONFIGS / "quickstart_sft.yaml", sft_overrides)) as trainer:
        trainer.fit()
    print(f"      done in {time.perf_counter() - start:.1f}s")

    start = _step(4, "GRPO through the 3D-HybridEngine (configs/quickstart_grpo.yaml)")
    with RLTrainer(load_config(CONFIGS / "quickstart_grpo.yaml", grpo_overrides)) as trainer:
        trainer.fit()
    print(f"      done in {time.perf_counter() - start:.1f}s")

    run = json.loads((out / "grpo" / "summary.json").read_text())  # the trainer's own summary
    before, after = run["val_reward_before"], run["val_reward_after"]
    summary = {
        "task": TASK,
        "seed": seed,
        "val_accuracy_before_grpo": before,
        "val_accuracy_after_grpo": after,
        "grpo_steps": run["steps"],
        "max_train_rollout_logprob_abs_diff": run["max_train_rollout_logprob_abs_diff"],
        "wall_seconds": time.perf_counter() - began,
        "metrics": str(out / "grpo" / "metrics.jsonl"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    improved = after > before
    print(
        f"validation accuracy (greedy, {TASK}): {before:.1%} before GRPO -> {after:.1%} after "
        f"{run['steps']} steps; {'LEARNED' if improved else 'DID NOT IMPROVE'} — {out / 'summary.json'} "
        f"({summary['wall_seconds']:.0f}s)"
    )
    return 0 if improved else 1
