"""One run per trainer.output_dir, checked with real processes holding the lock: a second run is
refused at once naming the holder, a lock left by a killed run is taken over with one line, and the
torchrun ranks of one job share their launcher's (or rank 0's) lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megarl.trainer.run_lock import (
    LOCK_FILE,
    TOKEN_ENV,
    RunDirInUseError,
    RunLock,
    claim,
    handed_to_children,
    hold_for_job,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
HOLD = """
import os, sys
from megarl.trainer.run_lock import hold_for_job
rank = None if sys.argv[2] == "driver" else int(sys.argv[2])
with hold_for_job(sys.argv[1], rank):
    print("held", os.environ.get("MEGARL_RUN_LOCK_TOKEN"), flush=True)
    sys.stdin.read()  # until the test closes stdin
"""


def holder(out: Path, rank: str = "driver", env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process holding the run lock of `out` (as the job runner does) until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out), rank],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k != TOKEN_ENV},
            "PYTHONPATH": str(REPO),
            **(env or {}),
        },
    )
    return proc


def held(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line.startswith("held"), line
    return line.split()[1]


def stop(proc: subprocess.Popen) -> int:
    proc.stdin.close()
    return proc.wait(timeout=30)


def refused(proc: subprocess.Popen) -> str:
    """The last line of a holder that was refused the lock (its RunDirInUseError)."""
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    return err.strip().splitlines()[-1]


def test_a_second_run_is_refused_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    first = holder(out)
    held(first)
    start = time.perf_counter()
    with pytest.raises(RunDirInUseError) as e:
        RunLock.acquire(out)
    assert time.perf_counter() - start < 1
    message = str(e.value)
    assert message.startswith(
        f"trainer.output_dir={out} is in use by another megarl run: pid {first.pid} on host "
        f"{socket.gethostname()}, running since 20"
    )
    assert message.endswith(
        f" UTC; lock file {out / LOCK_FILE}. Wait for that run to finish (or stop it), or give this run "
        "another trainer.output_dir"
    )
    assert stop(first) == 0
    assert not (out / LOCK_FILE).exists()  # released (and removed) at exit
    lock = RunLock.acquire(out)  # free again
    lock.release()


def test_a_lock_left_by_a_killed_run_is_taken_over_with_one_line(tmp_path):
    out = tmp_path / "run"
    first = holder(out)
    held(first)
    first.send_signal(signal.SIGKILL)  # no chance to release: the file stays, the kernel drops the lock
    first.wait(timeout=30)
    assert (out / LOCK_FILE).is_file()
    lines: list[str] = []
    lock = RunLock.acquire(out, say=lines.append)
    assert len(lines) == 1 and lines[0].startswith(
        f"megarl: took over {out / LOCK_FILE} from a run that is no longer running (pid {first.pid} on host "
        f"{socket.gethostname()}, running since 20"
    )
    assert lines[0].endswith("UTC); its files stay as they are")
    lock.release()


def test_two_trainers_of_one_process_are_refused_and_close_releases(tmp_path):
    release = claim(tmp_path)  # what a RunSession takes without a job runner
    with pytest.raises(RunDirInUseError, match="already used by another trainer of this process; close"):
        claim(tmp_path)
    release()
    assert not (tmp_path / LOCK_FILE).exists()
    with hold_for_job(tmp_path, rank=None):  # the job runner's, claimed by its one session
        unclaim = claim(tmp_path)
        with pytest.raises(RunDirInUseError, match="another trainer of this process"):
            claim(tmp_path)
        unclaim()
        assert (tmp_path / LOCK_FILE).exists()
    assert not (tmp_path / LOCK_FILE).exists()


def test_torchrun_ranks_use_their_launchers_lock_and_a_stranger_is_refused(tmp_path):
    out = tmp_path / "run"
    with hold_for_job(out, rank=None) as lock, handed_to_children(lock):  # `megarl train`, starting torchrun
        token = os.environ[TOKEN_ENV]
        rank0 = holder(out, "0", {TOKEN_ENV: token})
        assert held(rank0) == token and stop(rank0) == 0
        assert (out / LOCK_FILE).exists()  # a rank never releases its launcher's lock
        stranger = holder(out, "0", {TOKEN_ENV: "another-job"})
        assert refused(stranger).startswith(  # the launcher of that job does not hold it
            f"megarl.trainer.run_lock.RunDirInUseError: the process that started this one "
            f"(MEGARL_RUN_LOCK_TOKEN=another-job) does not hold {out / LOCK_FILE}; pid {os.getpid()} on host"
        )
    assert TOKEN_ENV not in os.environ and not (out / LOCK_FILE).exists()


def test_without_a_launcher_rank_0_takes_the_lock_and_the_other_ranks_wait_for_it(tmp_path):
    out = tmp_path / "run"
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", "TORCHELASTIC_RUN_ID": "none"}
    rank1 = holder(out, "1", job)  # starts first: waits, writing nothing
    time.sleep(1.0)
    assert rank1.poll() is None and not (out / LOCK_FILE).exists()
    rank0 = holder(out, "0", job)
    held(rank0), held(rank1)
    other_job = holder(out, "0", {**job, "MASTER_PORT": "29556"})
    assert f"is in use by another megarl run: pid {rank0.pid} on host" in refused(other_job)
    assert stop(rank1) == 0 and stop(rank0) == 0
    assert not (out / LOCK_FILE).exists()


@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_megarl_train_in_a_directory_in_use_is_refused_within_seconds(tiny_models, tmp_path, launcher):
    from tests.helpers.data import verl_row, write_parquet

    out = tmp_path / "run"
    rows = [verl_row(f"reverse {d}", d[::-1], data_source="megarl/digits_reverse") for d in ("123", "4567")]
    data = write_parquet(tmp_path / "train.parquet", rows)
    first = holder(out)
    held(first)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    before = sorted(p.name for p in out.rglob("*"))
    argv = [
        "train",
        str(REPO / "configs" / "quickstart_grpo.yaml"),
        f"model.path={tiny_models['llama']}",
        f"data.train_files=[{data}]",
        "data.val_files=[]",
        "trainer.eval_every=0",
        f"trainer.output_dir={out}",
        f"trainer.launcher={launcher}",
    ]
    start = time.perf_counter()
    second = subprocess.run(
        [sys.executable, "-m", "megarl.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    seconds = time.perf_counter() - start
    assert second.returncode == 2, second.stderr
    assert (
        f"megarl train: error: trainer.output_dir={out} is in use by another megarl run: pid {first.pid}"
        in (second.stderr)
    )
    assert seconds < 5, f"refused after {seconds:.1f} s"
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing written: no status, log or config
    assert stop(first) == 0


def test_an_output_directory_that_cannot_be_created_is_named(tmp_path):
    from megarl.output_guard import OutputWriteError

    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputWriteError) as error:
        RunLock.acquire(tmp_path / "file" / "run")
    assert str(error.value) == (
        f"trainer.output_dir={tmp_path / 'file' / 'run'} cannot be created: {tmp_path / 'file'} is a file, "
        "not a directory; choose another location, or move the file away"
    )
    assert error.value.exit_code == 2
