"""The SLURM launch scripts on a real SLURM with two (simulated) nodes: each runs two steps of a tiny GRPO
run to completion; a failing job ends FAILED with its cause in the log; nothing is left running."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "quickstart_grpo.yaml"
SCRIPTS = REPO / "launch" / "slurm"
RAY_PROCESS_NAMES = (
    "raylet",
    "gcs_server",
    "ray::",
    "default_worker",
    "log_monitor",
    "dashboard",
    "ray start",
)
JOB_TIMEOUT_S = 420


def run_overrides(tiny_run: dict, out: Path, *extra: str) -> list[str]:
    """Two small GRPO steps of the random tiny Llama (what they learn does not matter here)."""
    return [
        f"model.path={tiny_run['model']}",
        f"data.train_files=[{tiny_run['data'] / 'train.parquet'}]",
        "data.val_files=[]",
        f"trainer.output_dir={out}",
        "trainer.total_steps=2",
        "trainer.eval_every=0",
        "trainer.save_every=-1",
        "data.train_batch_size=8",
        "algorithm.ppo_mini_batch_size=8",
        "rollout.n=4",
        "actor.micro_batch_size=8",
        "ref.micro_batch_size=8",
        "logging.backends=[console]",
        "logging.report=false",
        *extra,
    ]


def job_env() -> dict[str, str]:
    return {"MEGARL_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def leftovers(marker: str) -> list[str]:
    """Processes whose command line mentions `marker` (the run's output dir or the Ray port)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if marker in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.info['pid']}: {cmd[:160]}")
        except psutil.Error:
            pass
    return found


def assert_nothing_left(marker: str, grace_s: float = 20) -> None:
    deadline = time.monotonic() + grace_s
    while leftovers(marker) and time.monotonic() < deadline:
        time.sleep(1)
    assert not leftovers(marker), leftovers(marker)


def ray_processes() -> set[int]:
    """PIDs of live Ray processes on this machine (any cluster: the caller compares before and after)."""
    pids = set()
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            text = f"{proc.info['name']} {' '.join(proc.info['cmdline'] or [])}"
            if any(n in text for n in RAY_PROCESS_NAMES) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                pids.add(proc.info["pid"])
        except psutil.Error:
            pass
    return pids


def assert_no_new_ray_processes(before: set[int], grace_s: float = 30) -> None:
    deadline = time.monotonic() + grace_s
    while (ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(1)
    new = ray_processes() - before
    assert not new, [" ".join(psutil.Process(p).cmdline())[:160] for p in new if psutil.pid_exists(p)]


def steps_written(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("script", ["torchrun.sbatch", "ray.sbatch"])
def test_launch_script_runs_two_steps_on_two_nodes(slurm, tiny_run, tmp_path, script):
    out = tmp_path / "run"
    before = ray_processes()
    job = slurm.sbatch(SCRIPTS / script, [str(CONFIG), *run_overrides(tiny_run, out)], env=job_env(), nodes=2)
    state = slurm.wait(job, JOB_TIMEOUT_S)
    log = slurm.log(job)
    assert state == "COMPLETED", log[-4000:]
    assert steps_written(out) == [1, 2], log[-4000:]
    assert_nothing_left(str(out))
    assert_no_new_ray_processes(before)


def test_a_bad_config_fails_the_job_fast_with_the_cause_in_its_log(slurm, tiny_run, tmp_path):
    out = tmp_path / "run"
    overrides = run_overrides(tiny_run, out, "rollout.n=0")
    start = time.monotonic()
    job = slurm.sbatch(SCRIPTS / "torchrun.sbatch", [str(CONFIG), *overrides], env=job_env(), nodes=2)
    assert slurm.wait(job, 120) == "FAILED"
    assert time.monotonic() - start < 120
    assert "rollout.n=0" in slurm.log(job), slurm.log(job)[-3000:]
    assert_nothing_left(str(out))


def test_scancel_of_a_running_ray_job_leaves_no_process_behind(slurm, tiny_run, tmp_path):
    out = tmp_path / "run"
    overrides = run_overrides(tiny_run, out, "trainer.total_steps=50")
    before = ray_processes()
    job = slurm.sbatch(SCRIPTS / "ray.sbatch", [str(CONFIG), *overrides], env=job_env(), nodes=2)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not steps_written(out) and time.monotonic() < deadline:  # training has started
        time.sleep(2)
    assert steps_written(out), slurm.log(job)[-3000:]
    slurm.scancel(job)
    assert slurm.wait(job, 120) == "CANCELLED"
    assert_nothing_left(str(out), grace_s=30)
    assert_no_new_ray_processes(before)
