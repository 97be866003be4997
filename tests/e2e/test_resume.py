"""Runs that survive: the torchrun launcher killed mid-update and rerun (it resumes and gives the
uninterrupted run's step exactly), Ray runs killed mid-generate and mid-save and fed NaN losses, and the
run's HF export checked against the trainer's own engine."""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import time

import psutil
import pytest
import torch

from megarl.controller.worker import WorkerError
from megarl.trainer.bad_steps import BadStepsError
from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.rl_runs import (
    GRPO,
    SMALL_STEP,
    assert_same_metrics,
    greedy_vllm,
    megarl_cli,
    megarl_train,
    run,
    steps,
)
from tests.helpers.run_files import jsonl_history

pytestmark = pytest.mark.e2e

WORKER_TIMEOUT_S = 60
SMALL = (*SMALL_STEP, f"trainer.worker_timeout_s={WORKER_TIMEOUT_S}")  # the fault runs


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            pass
    return found


@pytest.fixture(scope="module")
def torchrun_run(grpo_run, rl_setup, tmp_path_factory):
    """Two GRPO steps under the torchrun launcher, saving after each (the uninterrupted reference)."""
    out = tmp_path_factory.mktemp("spmd")
    overrides = rl_setup.grpo_overrides(
        out, *GRPO, "trainer.total_steps=2", "trainer.save_every=1", "trainer.launcher=torchrun"
    )
    proc = megarl_train(overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the console holds megarl's lines only; every rank's output is in its log
    console = proc.stdout + proc.stderr
    for known in ("UserWarning", "FutureWarning", "tcmalloc", "WARNING"):
        assert known not in console, (known, console)
    assert proc.stdout.splitlines()[-1].startswith("step 2/2 | reward "), proc.stdout
    for rank in (0, 1):
        assert "vllm" in (out / "logs" / f"actor_rank{rank}.log").read_text().lower(), rank
    return out, overrides


def test_torchrun_launcher_gives_the_ray_runs_step_one(grpo_run, torchrun_run):
    out, _ = torchrun_run
    spmd = jsonl_history(out)
    ray_step1 = steps(grpo_run.history)[0]
    compared = assert_same_metrics(ray_step1, spmd[1], rel=1e-6, abs_=1e-9)
    assert len(compared) > 20
    assert spmd[0]["val/reward/mean"] == grpo_run.history[0]["val/reward/mean"]


def test_torchrun_rank_killed_mid_update_then_rerun_resumes_and_matches(torchrun_run, rl_setup, tmp_path):
    """Rank 1 is SIGKILLed in step 2's policy update: the job exits non-zero at once, naming the rank,
    its host, the role and the call, with no process left; the same command then resumes from step 1
    and its step 2 is the uninterrupted run's step 2, bit for bit."""
    reference, _ = torchrun_run
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step_1", out / "checkpoints" / "step_1")
    (out / "checkpoints" / "latest").write_text("step_1\n")
    (out / "metrics.jsonl").write_text(
        "".join(reference.joinpath("metrics.jsonl").read_text().splitlines(True)[:2])
    )
    overrides = rl_setup.grpo_overrides(
        out,
        *GRPO,
        "trainer.total_steps=2",
        "trainer.save_every=1",
        "trainer.launcher=torchrun",
        f"trainer.worker_timeout_s={WORKER_TIMEOUT_S}",
    )
    start = time.monotonic()
    killed = megarl_train(overrides, env=_env(MEGARL_FAULT="kill@actor.update#1/1"))
    seconds = time.monotonic() - start
    message = killed.stdout[-4000:] + killed.stderr[-4000:]
    assert killed.returncode != 0, message
    for part in (
        "rank 1",
        "actor.update",
        "resume",
        f"each rank's output: {out / 'logs' / 'actor_rank0.log'}",
    ):
        assert part in message, (part, message)
    assert seconds < WORKER_TIMEOUT_S + 60, seconds  # start-up + step 2's first stages + the kill
    assert processes_mentioning(str(out)) == []
    assert (out / "checkpoints" / "latest").read_text() == "step_1\n"

    rerun = megarl_train(overrides, env=_env())
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    expected, actual = jsonl_history(reference), jsonl_history(out)
    assert sorted(actual) == [0, 1, 2]
    compared = assert_same_metrics(expected[2], actual[2])
    assert len(compared) > 20 and "actor/pg_loss" in compared
    assert (out / "checkpoints" / "latest").read_text() == "step_2\n"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MEGARL_FAULT"}
    return {**env, **extra}


def test_ray_run_killed_mid_generate_mid_save_and_fed_nan_losses(rl_setup, tmp_path, monkeypatch):
    """One run directory, three commands, as a user would live them:
    1. rank 1 is SIGKILLed generating step 2: WorkerError naming step, stage, role, rank and host; the
       actors are gone; step_1 is latest.
    2. rerun: resumes from step_1; step 2's loss is NaN (skipped, counted, the run goes on); step 3's
       save is killed half way: step_2 stays latest, step_3.partial is left and never picked, step 3's
       metrics are not logged (it is redone).
    3. rerun: resumes from step_2 (whose bad step is in its saved count); NaN losses in steps 3 and 4
       make three bad steps in a row: trainer.max_bad_steps=3 stops the run with a message."""
    out = tmp_path / "run"

    def config(*extra):
        return rl_setup.grpo_config(out, *SMALL, "trainer.total_steps=5", "trainer.save_every=1", *extra)

    monkeypatch.setenv("MEGARL_FAULT", "kill@actor.generate#2/1")
    trainer = RLTrainer(config())
    pids = [p["pid"] for p in trainer.roles.actor.processes]
    with pytest.raises(WorkerError) as killed, trainer:
        trainer.fit()
    message = str(killed.value)
    for part in ("step 2", "generate", "rank 1", "actor", platform.node(), f"output: {out / 'logs'}"):
        assert part in message, (part, message)
    assert (out / "checkpoints" / "latest").read_text() == "step_1\n"
    time.sleep(2)
    assert [pid for pid in pids if _alive(pid)] == []

    monkeypatch.setenv("MEGARL_FAULT", "nan@actor.update#1;kill@actor.save_checkpoint:model_written#2/1")
    with pytest.raises(WorkerError) as killed:
        run(config())
    assert "save_checkpoint" in str(killed.value)
    history = jsonl_history(out)
    assert sorted(history) == [1, 2]  # step 3 died in its save: it is redone after a resume
    assert history[2]["trainer/bad_steps"] == 1 and history[2]["actor/bad_updates"] == 1
    assert math.isnan(float(history[2]["actor/grad_norm"]))  # the update was skipped
    assert (out / "checkpoints" / "latest").read_text() == "step_2\n"
    assert (out / "checkpoints" / "step_3.partial").is_dir() and not (out / "checkpoints" / "step_3").exists()

    monkeypatch.setenv("MEGARL_FAULT", "nan@actor.update#1-2")
    with pytest.raises(BadStepsError, match=r"steps 2, 3, 4: 3 steps in a row"):  # step 2's count was saved
        run(config("trainer.max_bad_steps=3"))
    history = jsonl_history(out)
    assert sorted(history) == [1, 2, 3, 4]  # step 3 was redone from step_2
    assert history[4]["trainer/bad_steps"] == 3
    # the bad steps' checkpoints hold step 2's weights: no NaN update ever reached the parameters
    assert (out / "checkpoints" / "latest").read_text() == "step_4\n"


def test_the_runs_hf_export_answers_as_the_trainers_engine_did(grpo_run, tmp_path):
    """trainer.save_hf wrote <run>/hf from the live actor; `megarl convert mcore-to-hf` of the run's
    latest checkpoint gives the same tensors; a fresh vLLM engine on the export answers the validation
    prompts, greedily, token for token as the trainer's engine did after step 12."""
    from safetensors.torch import load_file

    out = grpo_run.out
    exported = tmp_path / "export"
    proc = megarl_cli("convert", "mcore-to-hf", "--ckpt", out / "checkpoints" / "latest", "--out", exported)
    assert proc.returncode == 0, proc.stderr[-3000:]
    live = {k: v for f in sorted((out / "hf").glob("*.safetensors")) for k, v in load_file(f).items()}
    converted = {k: v for f in sorted(exported.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert live.keys() == converted.keys()
    for name, tensor in live.items():
        assert torch.equal(converted[name], tensor), name

    records = [json.loads(line) for line in (out / "validation" / "step_12.jsonl").read_text().splitlines()]
    assert len(records) == 64
    answers = greedy_vllm(exported, [r["input_ids"] for r in records], grpo_run.cfg)
    assert answers == [r["output_ids"] for r in records]
