"""Dead and hung ranks under torchrun, supervised as `megarl train trainer.launcher=torchrun` does: the
job ends non-zero, promptly, with one post-mortem naming the rank, and leaves no process behind."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.multiproc.fault_job import TIMEOUT_S

pytestmark = pytest.mark.multiproc


def _run(tmp_path, fault: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "MEGARL_FAULT": fault}
    cmd = [sys.executable, "-m", "tests.multiproc.fault_job", "launch", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    return proc, time.time()


def _helpers(tmp_path) -> list[int]:
    return [pid for path in tmp_path.glob("helper_*.json") for pid in json.loads(path.read_text())]


def _status(tmp_path, rank: int) -> dict:
    return json.loads((tmp_path / "status" / f"rank_{rank}.json").read_text())


def test_a_hung_rank_times_out_the_others_and_is_named(tmp_path):
    proc, _ = _run(tmp_path, "hang@flat.double#1/1")
    assert proc.returncode == 1
    message = proc.stderr[proc.stderr.index("megarl train: the torchrun job failed") :]
    lines = message.splitlines()
    assert (
        lines[1].startswith("rank 1 on ")
        and "role flat) hung in flat.double: the other ranks timed out" in lines[1]
    )
    assert f"({TIMEOUT_S:g} s, trainer.worker_timeout_s)" in lines[1]
    assert (
        lines[2] == "the other ranks:" and "rank 0 on" in lines[3] and "Timed out waiting 5000ms" in lines[3]
    )
    assert (  # the job saved no checkpoint: no resume is promised
        f"no checkpoint was saved under {tmp_path / 'checkpoints'}, so rerunning starts from step 0 "
        "(trainer.save_every=N saves every N steps)"
    ) in message
    assert _status(tmp_path, 0)["state"] == "failed" and _status(tmp_path, 1)["in_call"]
    assert not [p for p in _helpers(tmp_path) if psutil.pid_exists(p)]


def test_a_killed_rank_ends_the_job_promptly_with_no_orphan(tmp_path):
    proc, ended = _run(tmp_path, "kill@flat.double#2/1")
    assert proc.returncode == 1
    killed = _status(tmp_path, 1)
    assert ended - killed["updated"] < 20  # measured ≈ 2 s to torchrun's exit, ≈ 3 s to the parent's
    message = proc.stderr[proc.stderr.index("megarl train: the torchrun job failed") :]
    assert (
        f"rank 1 on {killed['host']} (pid {killed['pid']}, role flat) was killed by SIGKILL in flat.double"
        in message
    )
    # torchrun signals only the process groups of live ranks: the killed rank's Manager was orphaned
    assert "the job left behind" in message
    assert not [p for p in _helpers(tmp_path) if psutil.pid_exists(p)]
