"""The SLURM launch scripts on a real SLURM with two (simulated) nodes, each run a tiny two-step GRPO run
to completion: torchrun.sbatch uninterrupted (the reference), torchrun.sbatch and ray.sbatch warned by
SLURM's SIGUSR1 in step 1: each requeues, and the rerun that resumes equals the reference bit for bit. A failing job (bad config, killed rank) ends
FAILED with its cause in the log, soon; nothing is left running; torch.distributed's store listens on the
rendezvous address alone."""

from __future__ import annotations

import re
import socket
import sys
import time

import psutil
import pytest

from tests.helpers.launch import (
    CONFIG,
    REPO,
    assert_no_new_ray_processes,
    assert_nothing_left,
    job_env,
    leftovers,
    non_loopback_listeners,
    ray_processes,
    run_overrides,
    steps_written,
)
from tests.helpers.rl_runs import assert_same_metrics
from tests.helpers.run_files import jsonl_history

pytestmark = pytest.mark.slurm

SCRIPTS = REPO / "launch" / "slurm"
JOB_TIMEOUT_S = 420
TRAINING = "2 steps of 8 prompts"  # the trainer's first line, printed as step 1 begins
PYTHON = sys.executable  # the jobs' MEGARL_PYTHON (job_env)


def _job_env() -> dict[str, str]:
    # one thread per rank, as Ray's ranks have (torchrun sets it only for several ranks per node), so
    # that both launchers' runs of the same layout equal bit for bit
    return job_env(OMP_NUM_THREADS="1")


def _wait_for(slurm, job: int, text: str, deadline: float) -> None:
    while text not in slurm.log(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert text in slurm.log(job), slurm.log(job)[-3000:]


@pytest.fixture(scope="module")
def varied_reward(tmp_path_factory) -> list[str]:
    """A reward that differs between the samples of a prompt (the random tiny model earns 0 from the digits
    rule on every one, which would leave GRPO's advantages, the gradients and the weights at 0): then the
    signalled runs' bit-exact comparison covers the updates too, not only sampling and data order."""
    path = tmp_path_factory.mktemp("reward") / "parity.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(sum(map(ord, solution_str)) % 2)\n"
    )
    # no reward time limit: on 2 busy cores (two "nodes", each with a vLLM engine whose CPU threads spin)
    # this one-line function was once starved past the default 10 s in a rerun, and the row scored 0
    return [f"reward.function.path={path}", "reward.timeout_s=0"]


@pytest.fixture(scope="module")
def reference(slurm, tiny_run, varied_reward, tmp_path_factory) -> dict:
    """torchrun.sbatch's two steps on two nodes, uninterrupted; what listens while it trains."""
    out = tmp_path_factory.mktemp("reference") / "run"
    overrides = run_overrides(tiny_run, out, *varied_reward)
    job = slurm.sbatch(SCRIPTS / "torchrun.sbatch", [str(CONFIG), *overrides], env=_job_env(), nodes=2)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    _wait_for(slurm, job, TRAINING, deadline)
    # torchrun on each node and the ranks (not srun, whose own I/O ports are SLURM's)
    pids = [
        int(pid) for pid, cmd in (ln.split(": ", 1) for ln in leftovers(str(out))) if cmd.startswith(PYTHON)
    ]
    listening = {}  # (ip, port) -> the command of the process listening there
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for c in proc.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    listening[c.laddr.ip, c.laddr.port] = " ".join(proc.cmdline()[:3])
        except psutil.Error:
            continue
    non_loopback = non_loopback_listeners(pids)
    state = slurm.wait(job, JOB_TIMEOUT_S)
    return {"job": job, "out": out, "state": state, "non_loopback": non_loopback, "listening": listening}


def test_torchrun_sbatch_runs_two_steps_on_two_nodes_its_store_on_the_rendezvous_address_alone(
    slurm, reference
):
    """The reference run completes; while it trains, torchrun's store (its first node's, which the ranks
    use) listens on the rendezvous address (the node's SLURM NodeAddr, 127.0.0.1 here) and no process of
    the job listens on any other address (torch alone would bind the store to every interface)."""
    job, out = reference["job"], reference["out"]
    log = slurm.log(job)
    assert reference["state"] == "COMPLETED", log[-4000:]
    assert steps_written(out) == [1, 2], log[-4000:]
    assert slurm.exit_code(job) == "0:0"
    addr, port = re.search(r"rendezvous (\S+):(\d+)", log).groups()
    assert "megarl.distributed.store" in reference["listening"].get((addr, int(port)), ""), reference[
        "listening"
    ]
    assert reference["non_loopback"] == []
    assert_nothing_left(str(out))


def _signalled_run(slurm, tiny_run, varied_reward, tmp_path, script: str) -> tuple[int, str]:
    """`script` on two nodes, warned by SIGUSR1 as SLURM warns (`scancel --signal=USR1 --batch`) in step 1:
    it requeues, and its rerun resumes from step_1 and completes; returns the job and its log (both
    runs')."""
    out = tmp_path / "run"
    job = slurm.sbatch(
        SCRIPTS / script,
        [str(CONFIG), *run_overrides(tiny_run, out, *varied_reward)],
        env=_job_env(),
        nodes=2,
        open_mode="append",
    )
    deadline = time.monotonic() + JOB_TIMEOUT_S
    _wait_for(slurm, job, TRAINING, deadline)
    time.sleep(2)  # every rank is in step 1 (its generation takes ~20 s: the engine starts)
    slurm.scancel(job, "--signal=USR1", "--batch")
    state = slurm.wait(job, JOB_TIMEOUT_S)
    log = slurm.log(job)
    assert state == "COMPLETED", (slurm.states(job), log[-4000:])
    stop = (
        f"megarl train: stopped by SIGUSR1 after step 1: checkpoint {out}/checkpoints/step_1 saved; rerun the "
        "same command to resume from it (exit code 75)"
    )
    assert stop in log and f"requeueing job {job}" in log, log[-4000:]
    assert f"resumed from {out / 'checkpoints' / 'step_1'}" in log, log[-4000:]
    assert steps_written(out) == [1, 2]  # each step once
    assert slurm.exit_code(job) == "0:0"
    assert_nothing_left(str(out), grace_s=30)
    return job, log


def _assert_equals_reference(reference: dict, out) -> None:
    expected, actual = jsonl_history(reference["out"]), jsonl_history(out)
    assert sorted(actual) == sorted(expected) == [1, 2]
    assert all(expected[step]["actor/grad_norm"] > 0 for step in expected)  # the weights moved
    for step in expected:
        assert "actor/pg_loss" in assert_same_metrics(expected[step], actual[step]), step


def test_sigusr1_in_step_1_checkpoints_and_requeues_a_torchrun_job_whose_rerun_equals_the_reference(
    slurm, tiny_run, varied_reward, tmp_path, reference
):
    """torchrun.sbatch (#SBATCH --signal=B:USR1@120, --requeue) gets SLURM's time-limit warning in step
    1: the script passes it to every rank (torchrun too), which finish the step, save it and exit 75,
    rank 0 with one line; the script requeues the job, whose rerun resumes from step_1, trains step 2
    and completes: both steps equal the uninterrupted reference's bit for bit."""
    job, log = _signalled_run(slurm, tiny_run, varied_reward, tmp_path, "torchrun.sbatch")
    assert "megarl torchrun.sbatch: SIGUSR1 received; the ranks finish their step and save it" in log
    _assert_equals_reference(reference, tmp_path / "run")


def test_sigusr1_in_step_1_checkpoints_and_requeues_a_ray_job_whose_rerun_equals_the_reference(
    slurm, tiny_run, varied_reward, tmp_path, reference
):
    """ray.sbatch gets SLURM's SIGUSR1 in step 1: the script passes it to the trainer, which finishes the
    step, saves it and exits 75 with one line (no Ray crash dump); the script tears Ray down and requeues
    the job, whose rerun resumes from step_1 and completes: both steps equal the torchrun reference's bit
    for bit (the same layout and data); no Ray process is left."""
    before = ray_processes()
    job, log = _signalled_run(slurm, tiny_run, varied_reward, tmp_path, "ray.sbatch")
    assert "SIGTERM received" not in log and "SIGUSR1 received; the trainer finishes its step" in log
    _assert_equals_reference(reference, tmp_path / "run")
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
        # RAY_py_gcs_connect_timeout_s: the head's `ray start` waits this long (30 s by default) for its
        # GCS, which cannot bind the port, before it exits (measured: 42 s -> 17 s); the script's part
        # starts when it exits
        env = job_env(
            RAY_PORT=str(taken.getsockname()[1]),
            MEGARL_JOIN_TIMEOUT_S="300",
            RAY_py_gcs_connect_timeout_s="5",
        )
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
