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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TASK = "digits_reverse"


def _step(n: int, text: str) -> float:
    print(f"[{n}/4] {text}", flush=True)
    return time.perf_counter()


def quickstart_overrides(out: Path, seed: int, family: str = "llama") -> tuple[list[str], list[str]]:
    """(SFT overrides, GRPO overrides) pointing the two configs at the run's directories."""
    data = out / "data"
    sft = [
        f"model.path={out / 'models' / family}",
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


@dataclass(frozen=True)
class TaskSetup:
    """What `prepare` leaves under its directory: the warm-started policy and the task's parquet files."""

    base_model: Path  # the tiny Llama before SFT
    sft_model: Path  # after the SFT warm start: answers in the task's format, right part of the time
    data: Path  # train.parquet, val.parquet, sft.parquet

    @property
    def train_files(self) -> list[str]:
        return [str(self.data / "train.parquet")]

    @property
    def val_files(self) -> list[str]:
        return [str(self.data / "val.parquet")]


def prepare(
    out: Path,
    seed: int = 0,
    log: Callable[[int, str], float] | None = None,
    overrides: Sequence[str] = (),
    family: str = "llama",
) -> TaskSetup:
    """Steps 1–3 of the quickstart under `out` (kept: a second call with the same `out` reuses them): the
    tiny Llama, the task's data and the SFT'd policy (`overrides` on the SFT config). The examples start
    from it."""
    from megarl.config import load_config
    from megarl.data.tasks import make_task
    from megarl.models.tiny import build_tiny_hf
    from megarl.trainer.sft import SFTTrainer

    out = Path(out).resolve()  # the worker processes may run in another directory
    setup = TaskSetup(out / "models" / family, out / "sft" / "hf", out / "data")
    if (setup.sft_model / "config.json").exists() and (setup.data / "val.parquet").exists():
        return setup
    step = log or (lambda n, text: time.perf_counter())
    sft_overrides, _ = quickstart_overrides(out, seed, family)

    start = step(1, f"building a tiny {family} model under {out}/models")
    build_tiny_hf(setup.base_model, family=family, seed=seed)
    print(f"      done in {time.perf_counter() - start:.1f}s")

    start = step(2, f"writing the {TASK} task (warm-start answers: half copy the input) under {out}/data")
    make_task(TASK, setup.data, seed=seed, sft_noise=0.5)
    print(f"      done in {time.perf_counter() - start:.1f}s")

    start = step(3, "SFT warm-start (configs/quickstart_sft.yaml)")
    with SFTTrainer(load_config(CONFIGS / "quickstart_sft.yaml", [*sft_overrides, *overrides])) as trainer:
        trainer.fit()
    print(f"      done in {time.perf_counter() - start:.1f}s")
    return setup


def task_config(setup: TaskSetup, out: str | Path, **keys: object) -> dict:
    """configs/quickstart_grpo.yaml as a dict pointed at `setup`'s data and writing to `out`, with `keys`
    (dotted, e.g. {"trainer.total_steps": 5}) on top: the examples' config."""
    from megarl.config.load import config_tree

    tree = config_tree(CONFIGS / "quickstart_grpo.yaml")
    tree["model"]["path"] = str(setup.sft_model)
    tree["data"]["train_files"], tree["data"]["val_files"] = setup.train_files, setup.val_files
    tree["trainer"]["output_dir"] = str(Path(out).resolve())
    return {**tree, **keys}


def run_quickstart(
    out: Path,
    seed: int = 0,
    grpo_steps: int | None = None,
    overrides: Sequence[str] = (),
    family: str = "llama",
) -> int:
    """Steps 1–4; `overrides` apply to both the SFT and the GRPO config (e.g. actor.backend=fsdp). A
    `family` outside megarl's conversion tables (phi3, gemma2) trains on the fsdp backend."""
    from megarl.models.tiny import TINY_FAMILIES

    if family not in TINY_FAMILIES:
        overrides = ["actor.backend=fsdp", *overrides]
    from megarl.config import load_config
    from megarl.trainer.rl_trainer import RLTrainer

    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    _, grpo_overrides = quickstart_overrides(out, seed, family)
    if grpo_steps is not None:
        grpo_overrides.append(f"trainer.total_steps={grpo_steps}")
    prepare(out, seed, log=_step, overrides=overrides, family=family)
    grpo_overrides += overrides

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
