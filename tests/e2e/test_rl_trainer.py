"""The RL trainer end to end: real Megatron workers on 2 CPU ranks, a real vLLM engine behind the
3D-HybridEngine, a real Ray cluster (and torchrun for the SPMD launcher), real parquet files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megarl.trainer.dataflow import Stage
from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.run_files import (
    assert_same_as_jsonl,
    image_stats,
    jsonl_history,
    tensorboard_history,
    wandb_history,
)

pytestmark = pytest.mark.e2e

LOGPROB_TOLERANCE = 2e-5  # engine vs recomputed log-probs after every weight sync, fp32 (DESIGN §6)
# 32 prompts × 8 samples a step: the step-to-step spread of the mean reward is ≈ 0.03
GRPO = ("data.train_batch_size=32", "algorithm.ppo_mini_batch_size=32")


def run(cfg) -> tuple[list[dict], list[torch.Tensor]]:
    """fit() with a stage inserted after generate that keeps each step's responses (the Python API's
    graph editing, used the way a user would)."""
    trainer = RLTrainer(cfg)
    responses: list[torch.Tensor] = []

    def keep(ctx, batch):
        if not ctx.validate:
            responses.append(batch["responses"].clone())

    trainer.flow.insert_after("generate", Stage("keep_responses", keep, reads=("responses",)))
    return trainer.fit(), responses


def steps(history: list[dict]) -> list[dict]:
    return [h for h in history if h["step"] > 0]


# the GRPO run also logs to TensorBoard and wandb (offline) and profiles step 2 on both ranks
OBSERVED = (
    "logging.backends=[console,tensorboard,wandb]",
    "trainer.profile_steps=[2]",
    "trainer.profile_ranks=[0,1]",
    "logging.report=true",
)


@pytest.fixture(scope="module")
def grpo_run(rl_setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo")
    cfg = rl_setup.grpo_config(out, *GRPO, "trainer.total_steps=12", "trainer.eval_every=12", *OBSERVED)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        history, responses = run(cfg)
    return cfg, history, responses, out


def test_grpo_reward_rises_and_engine_log_probs_match_megatron_every_step(grpo_run):
    _, history, _, out = grpo_run
    train = steps(history)
    assert len(train) == 12
    first = sum(h["reward/mean"] for h in train[:4]) / 4
    last = sum(h["reward/mean"] for h in train[-4:]) / 4
    assert last > first + 0.05, [round(h["reward/mean"], 3) for h in train]
    for h in train:
        assert h["train_rollout_logprob_abs_diff_max"] <= LOGPROB_TOLERANCE, h
    val = [h["val/reward/mean"] for h in history if "val/reward/mean" in h]
    assert len(val) == 2 and history[0]["step"] == 0  # before the first step, and after the last
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(13))
    for key in (
        "reward/mean",
        "reward/std",
        "response_length/mean",
        "actor/kl_loss",
        "actor/entropy",
        "actor/clip_frac",
        "actor/grad_norm",
        "actor/lr",
        "train_rollout_logprob_abs_diff",
        "timing/generate",
        "timing/update_actor",
        "throughput/tokens_per_s",
    ):
        assert math.isfinite(records[1][key]), key
    summary = json.loads((out / "summary.json").read_text())
    assert summary["val_reward_before"] == val[0] and summary["val_reward_after"] == val[-1]


def test_tensorboard_and_wandb_hold_exactly_what_metrics_jsonl_holds(grpo_run):
    *_, out = grpo_run
    jsonl = jsonl_history(out)
    assert sorted(jsonl) == list(range(13))
    assert_same_as_jsonl(tensorboard_history(out / "tensorboard"), jsonl, rel=1e-6)  # float32 events
    assert_same_as_jsonl(wandb_history(out), jsonl, rel=1e-12)


def test_the_run_report_has_a_real_plot_per_logged_curve(grpo_run):
    *_, out = grpo_run
    pngs = sorted(p.stem for p in (out / "report").glob("*.png"))
    expected = ["clip_frac", "entropy", "grad_norm", "kl", "logprob_diff", "lr", "response_length"]
    assert pngs == sorted([*expected, "reward", "throughput", "timing"])  # GRPO: no value loss
    for name in pngs:
        size, colors, std = image_stats(out / "report" / f"{name}.png")
        assert size[0] >= 600 and colors > 50 and std > 10, (name, size, colors, std)
    report = (out / "report" / "report.md").read_text()
    assert "| training steps | 12 of 12 planned |" in report and "Layout per role" in report


def test_a_profiled_step_has_a_trace_and_call_times_for_every_rank(grpo_run):
    *_, out = grpo_run
    step = out / "profile" / "step_2"
    for rank in (0, 1):
        trace = json.loads((step / f"rank_{rank}.json").read_text())
        assert len(trace["traceEvents"]) > 100, rank
    times = json.loads((step / "stage_times.json").read_text())
    actor = times["ranks"]["actor"]
    assert sorted(actor) == ["0", "1"]
    for rank in actor.values():
        assert rank["actor.generate"] > 0 and rank["actor.update"] > 0 and rank["ref.ref_log_prob"] > 0
    assert not (out / "profile" / "step_1").exists()


def test_torchrun_launcher_gives_the_ray_runs_step_one(grpo_run, rl_setup, tmp_path):
    cfg, history, _, _ = grpo_run
    out = tmp_path / "spmd"
    overrides = rl_setup.grpo_overrides(out, *GRPO, "trainer.total_steps=1", "trainer.launcher=torchrun")
    cmd = [sys.executable, "-m", "megarl.cli", "train", str(Path(cfg_path())), *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    spmd = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ray_step1, spmd_step1 = steps(history)[0], spmd[1]
    compared = [k for k in ray_step1 if not k.startswith(("timing/", "throughput/", "step_seconds"))]
    assert len(compared) > 20
    for key in compared:
        assert spmd_step1[key] == pytest.approx(ray_step1[key], rel=1e-6, abs=1e-9), key
    assert spmd[0]["val/reward/mean"] == history[0]["val/reward/mean"]


def cfg_path() -> Path:
    return Path(__file__).resolve().parents[2] / "configs" / "quickstart_grpo.yaml"


def test_actor_tp2_generates_the_same_tokens_and_step_one_loss_as_tp1(grpo_run, rl_setup, tmp_path):
    _, history, responses, _ = grpo_run
    cfg = rl_setup.grpo_config(
        tmp_path,
        *GRPO,
        "trainer.total_steps=1",
        "actor.parallel.tp=2",
        "rollout.tp=1",
    )
    tp2_history, tp2_responses = run(cfg)
    assert torch.equal(tp2_responses[0], responses[0])
    tp1, tp2 = steps(history)[0], steps(tp2_history)[0]
    assert tp2["actor/pg_loss"] == pytest.approx(tp1["actor/pg_loss"], rel=1e-5, abs=1e-6)
    assert tp2["actor/kl_loss"] == pytest.approx(tp1["actor/kl_loss"], rel=1e-5, abs=1e-7)
    assert tp2["actor/grad_norm"] == pytest.approx(tp1["actor/grad_norm"], rel=1e-5)
    assert tp2["reward/mean"] == tp1["reward/mean"]


def test_ppo_with_a_critic_runs_and_its_value_loss_falls(rl_setup, tmp_path):
    cfg = rl_setup.grpo_config(
        tmp_path,
        "algorithm.name=ppo",
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_loss=false",
        "algorithm.use_kl_in_reward=true",
        "critic.micro_batch_size=32",
        "critic.optimizer.lr=1e-3",
        "trainer.total_steps=5",
        "trainer.eval_every=0",
        "trainer.val_before_train=false",
    )
    history, _ = run(cfg)
    losses = [h["critic/value_loss"] for h in steps(history)]
    assert len(losses) == 5 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0], losses
    assert all(
        "kl/mean" in h and "timing/values" in h and "timing/update_critic" in h for h in steps(history)
    )


# each estimator's run also drives one of issue 11's trainer features (one start per run, not two)
ESTIMATOR_RUNS = {
    "rloo": (
        "algorithm.policy_loss=cispo",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token",
        "algorithm.rollout_correction.rollout_rs_threshold=2.0",
    ),
    "reinforce_plus_plus": ("algorithm.pf_ppo.enable=true",),
    "remax": ("algorithm.rollout_correction.bypass_mode=true", "algorithm.policy_loss=reinforce"),
}


@pytest.mark.parametrize("estimator", list(ESTIMATOR_RUNS))
def test_other_estimators_and_losses_run_end_to_end(rl_setup, tmp_path, estimator):
    cfg = rl_setup.grpo_config(
        tmp_path,
        "algorithm.name=ppo",
        f"algorithm.adv_estimator={estimator}",
        "trainer.total_steps=2",
        "trainer.eval_every=0",
        "trainer.val_before_train=false",
        *ESTIMATOR_RUNS[estimator],
    )
    history, _ = run(cfg)
    train = steps(history)
    assert len(train) == 2
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    for h in train:
        assert math.isfinite(h["actor/pg_loss"]) and math.isfinite(h["actor/grad_norm"])
        # bypass mode skips the recompute, so there is no train/rollout difference to log
        assert bypass != ("train_rollout_logprob_abs_diff_max" in h)
        assert h.get("train_rollout_logprob_abs_diff_max", 0.0) <= LOGPROB_TOLERANCE
    assert ("timing/remax_baseline" in train[0]) == (estimator == "remax")
    if estimator == "rloo":  # fp32 engine and trainer agree: weights ≈ 1, nothing rejected
        assert all(abs(h["rollout_corr/rollout_is_mean"] - 1) < 1e-4 for h in train), train
        assert all(h["rollout_corr/rollout_rs_masked_fraction"] == 0 for h in train)
    assert ("timing/pf_ppo" in train[0]) == (estimator == "reinforce_plus_plus")
