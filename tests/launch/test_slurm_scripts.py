"""The SLURM launch scripts on a real SLURM with two (simulated) nodes: each runs two steps of a tiny GRPO
run to completion; a failing job (bad config, killed rank) ends FAILED with its cause in the log, soon;
SLURM's SIGUSR1 warning checkpoints and requeues a job that then resumes; a cancelled one is torn down;
nothing is left running."""

from __future__ import annotations

import re
import socket
import time

import pytest

from tests.helpers.launch import (
    CONFIG,
    REPO,
    assert_no_new_ray_processes,
    assert_nothing_left,
    job_env,
    ray_processes,
    run_overrides,
    steps_written,
)

pytestmark = pytest.mark.slurm

SCRIPTS = REPO / "launch" / "slurm"
JOB_TIMEOUT_S = 420


@pytest.mark.parametrize("script", ["torchrun.sbatch", "ray.sbatch"])
def test_launch_script_runs_two_steps_on_two_nodes(slurm, tiny_run, tmp_path, script):
    out = tmp_path / "run"
    before = ray_processes()
    job = slurm.sbatch(SCRIPTS / script, [str(CONFIG), *run_overrides(tiny_run, out)], env=job_env(), nodes=2)
    state = slurm.wait(job, JOB_TIMEOUT_S)
    log = slurm.log(job)
    assert state == "COMPLETED", log[-4000:]
    assert steps_written(out) == [1, 2], log[-4000:]
    assert slurm.exit_code(job) == "0:0"
    assert_nothing_left(str(out))
    assert_no_new_ray_processes(before)


@pytest.mark.parametrize("script", ["torchrun.sbatch", "ray.sbatch"])
def test_a_bad_config_fails_the_job_before_anything_starts(slurm, tiny_run, tmp_path, script):
    out = tmp_path / "run"
    overrides = run_overrides(tiny_run, out, "rollout.n=0")
    before = ray_processes()
    start = time.monotonic()
    job = slurm.sbatch(SCRIPTS / script, [str(CONFIG), *overrides], env=job_env(), nodes=2)
    assert slurm.wait(job, 120) == "FAILED"
    assert time.monotonic() - start < 60
    log = slurm.log(job)
    assert "rollout.n=0 must be ≥ 1" in log and "srun" not in log, log[-3000:]  # no step was started
    assert slurm.exit_code(job) == "2:0"
    assert_nothing_left(str(out))
    assert_no_new_ray_processes(before)


@pytest.mark.parametrize(
    ("script", "cause"),
    [("torchrun.sbatch", ("SIGKILL", "rank")), ("ray.sbatch", ("rank 1", "actor.update", "killed"))],
)
def test_a_killed_rank_fails_the_job_within_bounds_naming_it(slurm, tiny_run, tmp_path, script, cause):
    """Rank 1 is SIGKILLed in its first update: torchrun's srun ends the other node's torchrun; under
    Ray the controller reports the dead rank and the script tears the cluster down."""
    out = tmp_path / "run"
    before = ray_processes()
    env = job_env(MEGARL_FAULT="kill@actor.update#1/1")
    start = time.monotonic()
    job = slurm.sbatch(SCRIPTS / script, [str(CONFIG), *run_overrides(tiny_run, out)], env=env, nodes=2)
    assert slurm.wait(job, 300) == "FAILED"
    seconds = time.monotonic() - start
    log = slurm.log(job)
    assert all(part in log for part in cause), log[-4000:]
    assert seconds < 300, seconds
    assert steps_written(out) == []
    assert_nothing_left(str(out))
    assert_no_new_ray_processes(before)


def test_a_ray_node_that_cannot_start_fails_the_job_at_once_naming_it(slurm, tiny_run, tmp_path):
    """The head's port is taken (RAY_PORT held here): its `ray start` exits, and the job fails without
    waiting out the join time-out, naming the node; whatever Ray started is torn down."""
    out = tmp_path / "run"
    before = ray_processes()
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        env = job_env(RAY_PORT=str(taken.getsockname()[1]), MEGARL_JOIN_TIMEOUT_S="300")
        start = time.monotonic()
        job = slurm.sbatch(
            SCRIPTS / "ray.sbatch", [str(CONFIG), *run_overrides(tiny_run, out)], env=env, nodes=2
        )
        assert slurm.wait(job, 200) == "FAILED"
    log = slurm.log(job)
    assert re.search(r"ray start on node[12] ended before all nodes joined", log), log[-3000:]
    assert time.monotonic() - start < 200
    assert_nothing_left(str(out))
    assert_no_new_ray_processes(before)


def test_sigusr1_checkpoints_and_requeues_a_ray_job_whose_rerun_resumes_then_scancel_ends_it(
    slurm, tiny_run, tmp_path
):
    """ray.sbatch (#SBATCH --signal=B:USR1@120, --requeue) gets SLURM's time-limit warning — SIGUSR1 to
    the batch shell, sent as SLURM sends it (`scancel --signal=USR1 --batch`) once training runs: the
    trainer finishes its step, saves it and exits 75 with one line, the script tears Ray down and
    requeues the job. Its rerun resumes from that checkpoint; `scancel` then ends it, CANCELLED, and
    no process is left."""
    out = tmp_path / "run"
    overrides = run_overrides(tiny_run, out, "trainer.total_steps=50")
    before = ray_processes()
    job = slurm.sbatch(
        SCRIPTS / "ray.sbatch", [str(CONFIG), *overrides], env=job_env(), nodes=2, open_mode="append"
    )
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not steps_written(out) and time.monotonic() < deadline:  # training has started
        time.sleep(1)
    assert steps_written(out), slurm.log(job)[-3000:]
    slurm.scancel(job, "--signal=USR1", "--batch")
    while "resumed from" not in slurm.log(job) and time.monotonic() < deadline:
        time.sleep(1)
    log = slurm.log(job)
    m = re.search(
        rf"megarl train: stopped by SIGUSR1 after step (\d+): checkpoint {re.escape(str(out))}/checkpoints/"
        r"step_(\d+) saved; rerun the same command to resume from it \(exit code 75\)",
        log,
    )
    assert m and m[1] == m[2], log[-4000:]
    assert f"requeueing job {job}" in log and f"resumed from {out / 'checkpoints' / f'step_{m[1]}'}" in log, (
        log[-4000:]
    )
    saved = int(m[1])
    while max(steps_written(out), default=0) <= saved and time.monotonic() < deadline:  # the rerun trains
        time.sleep(1)
    assert steps_written(out) == list(range(1, max(steps_written(out)) + 1))  # each step once
    slurm.scancel(job)
    deadline = time.monotonic() + 120
    while "CANCELLED" not in slurm.states(job) and time.monotonic() < deadline:
        time.sleep(1)
    assert slurm.states(job)[-1] == "CANCELLED", (slurm.states(job), slurm.log(job)[-3000:])
    assert_nothing_left(str(out), grace_s=30)
    assert_no_new_ray_processes(before)
