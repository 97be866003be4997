"""Runs that survive: the torchrun launcher SIGKILLed, a rank killed mid-update, then SIGTERMed mid-step
(it resumes and gives the uninterrupted run's step exactly, and stops at a checkpoint); two Ray runs at
once, each on its own loopback cluster, one SIGTERMed mid-step and resumed bit-exactly; Ray runs killed
mid-generate and mid-save and fed NaN losses, and the run's HF export checked against the trainer's own
engine."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shutil
import signal
import time

import psutil
import pytest
import torch

from megarl.controller.worker import WorkerError
from megarl.trainer.bad_steps import BadStepsError
from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.launch import non_loopback_listeners
from tests.helpers.rl_runs import (
    GRPO,
    SMALL_STEP,
    assert_same_metrics,
    greedy_vllm,
    megarl_cli,
    megarl_train,
    run,
    start_megarl_train,
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


def test_torchrun_supervisor_sigkilled_rank_killed_then_sigterm_mid_step_saves_it(
    torchrun_run, rl_setup, tmp_path
):
    """One run directory, resumed from the reference's step_1, three commands:
    1. `megarl train` (the torchrun supervisor) is SIGKILLed in step 2: torchrun and both ranks die with
       it; step_1 stays latest.
    2. rank 1 is SIGKILLed in step 2's policy update: the job exits non-zero at once, naming the rank,
       its host, the role and the call, with no process left.
    3. the same command, SIGTERMed in step 2: it resumes from step 1, finishes step 2 — the uninterrupted
       run's step 2, bit for bit —, saves it (save_every=-1: the signal's save) and exits 75 with one
       line; nothing is left running."""
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
        "trainer.launcher=torchrun",
        f"trainer.worker_timeout_s={WORKER_TIMEOUT_S}",
        "trainer.preempt_grace_s=240",
    )

    supervisor = start_megarl_train(overrides, env=_env())
    _wait_for_step(out, 2, supervisor)
    ranks = processes_mentioning(str(out))
    assert len(ranks) >= 3, ranks  # torchrun and two ranks
    supervisor.kill()
    supervisor.communicate(timeout=60)
    gone_by = time.monotonic() + 15
    while processes_mentioning(str(out)) and time.monotonic() < gone_by:
        time.sleep(0.5)
    assert processes_mentioning(str(out)) == []
    assert (out / "checkpoints" / "latest").read_text() == "step_1\n"

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

    shutil.rmtree(out / "status")  # the killed run's: step 2 is awaited in the new run's files
    rerun = start_megarl_train(overrides, env=_env())
    _wait_for_step(out, 2, rerun)
    rerun.send_signal(signal.SIGTERM)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 75, stdout[-3000:] + stderr[-3000:]
    assert stderr.splitlines()[-1] == (
        f"megarl train: stopped by SIGTERM after step 2: checkpoint {out / 'checkpoints' / 'step_2'} saved; "
        "rerun the same command to resume from it (exit code 75)"
    ), stderr[-3000:]
    assert "SignalException" not in stderr  # torchrun's own report stays off the console
    expected, actual = jsonl_history(reference), jsonl_history(out)
    assert sorted(actual) == [0, 1, 2]
    compared = assert_same_metrics(expected[2], actual[2])
    assert len(compared) > 20 and "actor/pg_loss" in compared
    assert (out / "checkpoints" / "latest").read_text() == "step_2\n"
    assert processes_mentioning(str(out)) == []


def _wait_for_step(out, step: int, proc, timeout_s: float = 400) -> None:
    """Until `step` runs: a rank's status file says so (torchrun), or step - 1 is in metrics.jsonl (Ray)."""
    spmd = "trainer.launcher=torchrun" in proc.args
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if spmd:
            for path in (out / "status").glob("rank_*.json"):
                try:
                    if json.loads(path.read_text()).get("step") == step:
                        return
                except ValueError:
                    pass
        elif (out / "metrics.jsonl").exists() and step - 1 in jsonl_history(out):
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} did not start within {timeout_s} s")


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


def _tree(pid: int) -> list[int]:
    root = psutil.Process(pid)
    return [pid, *(c.pid for c in root.children(recursive=True))]


def test_two_ray_runs_at_once_each_on_its_own_loopback_cluster_one_sigtermed_then_resumed(rl_setup, tmp_path):
    """Runs A and B (same config, other directories, no RAY_ADDRESS) at once: each starts a cluster of
    its own (a GCS in each process tree), listening on loopback only. A is SIGTERMed in step 2: it
    finishes the step, saves it (save_every=-1: the signal's save), stops every process of its own and
    exits 75 with one line, while B — whose cluster A's end must not touch — trains to the end. The
    same command then resumes A: every step of A equals B's, bit for bit."""
    env = {k: v for k, v in _env().items() if k != "RAY_ADDRESS"}  # not the tests' session cluster
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    overrides = {d: rl_setup.grpo_overrides(d, *SMALL, "trainer.total_steps=4") for d in (a_dir, b_dir)}
    a = start_megarl_train(overrides[a_dir], env=env)
    b = start_megarl_train(overrides[b_dir], env=env)
    try:
        _wait_for_step(a_dir, 2, a)
        a_tree, b_tree = _tree(a.pid), _tree(b.pid)
        for tree in (a_tree, b_tree):
            names = [_name(pid) for pid in tree]
            assert "gcs_server" in names, names
        assert not set(a_tree) & set(b_tree)
        # Ray's own processes; megarl's rank processes are left out: rank 0 of each worker group hosts
        # torch.distributed's TCPStore, which torch binds to every interface (no bind address to give)
        ray_own = [pid for pid in a_tree + b_tree if not _name(pid).startswith("ray::_RankHost")]
        assert non_loopback_listeners(ray_own) == []
        a.send_signal(signal.SIGTERM)
        a_out, a_err = a.communicate(timeout=300)
        b_out, b_err = b.communicate(timeout=600)
    finally:
        for proc in (a, b):
            proc.kill()
    assert a.returncode == 75, a_out[-3000:] + a_err[-3000:]
    m = re.fullmatch(
        rf"megarl train: stopped by SIGTERM after step (\d): checkpoint {re.escape(str(a_dir))}/checkpoints/"
        r"step_(\d) saved; rerun the same command to resume from it \(exit code 75\)",
        a_err.splitlines()[-1],
    )
    assert m and m[1] == m[2] and int(m[1]) in (2, 3), a_err[-3000:]
    stopped_at = int(m[1])
    assert "SIGTERM received" not in a_err  # Ray's C++ crash dump
    assert (a_dir / "checkpoints" / "latest").read_text() == f"step_{stopped_at}\n"
    assert sorted(jsonl_history(a_dir)) == list(range(1, stopped_at + 1))
    time.sleep(2)
    assert [pid for pid in a_tree if _alive(pid)] == []
    assert b.returncode == 0, b_out[-3000:] + b_err[-3000:]

    rerun = megarl_train(overrides[a_dir], env=env)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"resumed from {a_dir / 'checkpoints' / f'step_{stopped_at}'}" in rerun.stdout
    a_steps, b_steps = jsonl_history(a_dir), jsonl_history(b_dir)
    assert sorted(a_steps) == sorted(b_steps) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        compared = assert_same_metrics(b_steps[step], a_steps[step])
        assert "actor/pg_loss" in compared, step


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
