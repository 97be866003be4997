"""Running the RL trainer in the e2e tests: the in-process API with a stage that keeps each step's
responses, the torchrun launcher through the CLI, and comparing two runs' metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megarl.trainer.dataflow import Stage
from megarl.trainer.rl_trainer import RLTrainer

REPO = Path(__file__).resolve().parents[2]
GRPO_CONFIG = REPO / "configs" / "quickstart_grpo.yaml"
# engine vs recomputed log-probs after every weight sync, fp32 (DESIGN §6): vLLM's CPU kernels and Megatron
# sum in different orders, so the max over a run's tokens depends on the machine (2.5e-5 at step 9 on one
# machine, under 2e-5 on another, same code)
LOGPROB_TOLERANCE = 5e-5
# 32 prompts × 8 samples a step: the step-to-step spread of the mean reward is ≈ 0.03
GRPO = ("data.train_batch_size=32", "algorithm.ppo_mini_batch_size=32")
# a small GRPO step (8 prompts × 4 samples) for runs that test what happens, not learning
SMALL_STEP = (
    "data.train_batch_size=8",
    "algorithm.ppo_mini_batch_size=8",
    "rollout.n=4",
    "actor.micro_batch_size=8",
    "ref.micro_batch_size=8",
    "trainer.eval_every=0",
    "trainer.val_before_train=false",
)
# what differs between two runs of the same steps: wall-clock measurements (generate/*_seconds: the
# hybrid engine's transition and engine time), and checkpoint sizes (their metadata holds the run's paths)
NOT_COMPARED = ("timing/", "throughput/", "step_seconds", "generate/", "checkpoint/")


def run(cfg) -> tuple[list[dict], list[torch.Tensor]]:
    """fit() with a stage inserted after generate that keeps each step's responses (the Python API's
    graph editing, used the way a user would); the workers stop at the end."""
    responses: list[torch.Tensor] = []

    def keep(ctx, batch):
        if not ctx.validate:
            responses.append(batch["responses"].clone())

    with RLTrainer(cfg) as trainer:
        trainer.flow.insert_after("generate", Stage("keep_responses", keep, reads=("responses",)))
        return trainer.fit(), responses


def steps(history: list[dict]) -> list[dict]:
    return [h for h in history if h["step"] > 0]


def megarl_train(overrides: list[str], env: dict | None = None, timeout: float = 600):
    """`megarl train configs/quickstart_grpo.yaml OVERRIDES` in a subprocess (CompletedProcess)."""
    cmd = [sys.executable, "-m", "megarl.cli", "train", str(GRPO_CONFIG), *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def start_megarl_train(overrides: list[str], env: dict | None = None) -> subprocess.Popen:
    """`megarl train configs/quickstart_grpo.yaml OVERRIDES` started in a subprocess (text pipes)."""
    cmd = [sys.executable, "-m", "megarl.cli", "train", str(GRPO_CONFIG), *overrides]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def assert_same_metrics(expected: dict, actual: dict, rel: float = 0.0, abs_: float = 0.0) -> list[str]:
    """Every metric of `expected` but NOT_COMPARED's equals `actual`'s (exactly by default); returns the
    keys compared."""
    compared = [k for k in expected if k != "step" and not k.startswith(NOT_COMPARED)]
    for key in compared:
        assert key in actual, key
        if rel or abs_:
            assert actual[key] == pytest.approx(expected[key], rel=rel, abs=abs_, nan_ok=True), key
        else:
            assert actual[key] == expected[key] or (
                actual[key] != actual[key] and expected[key] != expected[key]
            ), (
                key,
                expected[key],
                actual[key],
            )
    return compared


def megarl_cli(*argv, timeout: float = 600):
    """`megarl ARGV` in a subprocess (CompletedProcess)."""
    cmd = [sys.executable, "-m", "megarl.cli", *map(str, argv)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def greedy_vllm(model_dir: Path, prompt_token_ids: list[list[int]], cfg) -> list[list[int]]:
    """A fresh vLLM engine's greedy response tokens for each prompt (tests/helpers/vllm_greedy.py),
    with the run's validation length limit, ending at EOS as the trainer's validation does."""
    max_tokens = cfg.rollout.val.max_tokens or cfg.data.max_response_length
    return greedy_vllm_models([model_dir], prompt_token_ids, max_tokens)[str(model_dir)]


def greedy_vllm_models(
    model_dirs: list[Path], prompt_token_ids: list[list[int]], max_tokens: int
) -> dict[str, list[list[int]]]:
    """{model dir: greedy response tokens of each prompt}, ending at EOS, all models in one process."""
    import json

    cmd = [sys.executable, "-m", "tests.helpers.vllm_greedy", json.dumps(prompt_token_ids)]
    cmd += [*map(str, model_dirs), "--max-tokens", str(max_tokens), "--stop-at-eos"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
