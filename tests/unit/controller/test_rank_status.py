"""SPMD status files and the post-mortem `megarl train` prints when a torchrun job fails."""

import json

import pytest

from megarl.controller.rank_status import (
    RankStatus,
    post_mortem,
    read_statuses,
    torchrun_failures,
)

pytestmark = pytest.mark.unit

TORCHRUN_REPORT = """
Failures:
[1]:
  time      : 2026-12-01_16:15:40
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 3206)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 3206
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_16:15:40
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 3207)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 3207
======================================================
"""

DEAD_PID = 2**22 + 12345  # above pid_max: never a live process


def _status(tmp_path, rank, **fields):
    s = RankStatus()
    s.open(tmp_path, rank)
    s.fields.update(pid=DEAD_PID + rank, host="node1", **fields)
    s._write()
    return s


def test_status_file_follows_calls_and_the_end(tmp_path):
    s = RankStatus()
    s.open(tmp_path, 3)
    s.set_step(2)
    s.call("actor", "update")
    (got,) = read_statuses(tmp_path)
    assert got["rank"] == 3 and got["method"] == "actor.update" and got["in_call"] and got["step"] == 2
    s.returned()
    s.finish(RuntimeError("boom\nline 2"))
    got = json.loads((tmp_path / "rank_3.json").read_text())
    assert (got["state"], got["error"], got["in_call"]) == ("failed", "RuntimeError: boom\nline 2", False)
    assert [p.name for p in tmp_path.iterdir()] == ["rank_3.json"]  # no temporary file left


def test_parses_torchrun_failure_report():
    assert torchrun_failures(TORCHRUN_REPORT) == ({0: "SIGTERM", 1: "SIGKILL"}, 1)
    assert torchrun_failures("no report") == ({}, None)


def test_killed_rank_is_named_with_its_signal_and_call(tmp_path):
    _status(tmp_path, 0, role="actor", method="actor.update", in_call=True, step=2)
    _status(tmp_path, 1, role="actor", method="actor.update", in_call=True, step=2)
    advice = "rerun the same command to resume from RUN/checkpoints/step_2 (trainer.resume=auto)"
    message = post_mortem(tmp_path, 1, TORCHRUN_REPORT, resume_advice=advice)
    lines = message.splitlines()
    assert (
        lines[1]
        == f"rank 1 on node1 (pid {DEAD_PID + 1}, role actor) was killed by SIGKILL in actor.update (step 2)"
    )
    assert lines[2:4] == [
        "the other ranks:",
        f"  rank 0 on node1 (pid {DEAD_PID}, role actor) was stopped by torchrun in actor.update (step 2)",
    ]
    assert lines[-1] == advice


def test_hung_rank_is_told_apart_from_the_one_that_timed_out(tmp_path):
    error = "WorkerError: echo.double: ...: RuntimeError: [gloo] Timed out waiting 5000ms for recv operation"
    _status(tmp_path, 0, role="echo", method="echo.double", state="failed", error=error)
    _status(tmp_path, 1, role="echo", method="echo.double", in_call=True)
    message = post_mortem(tmp_path, 1, "", timeout_s=5)
    assert (
        f"rank 1 on node1 (pid {DEAD_PID + 1}, role echo) hung in echo.double: the other ranks timed out"
        in message
    )
    assert "(5 s, trainer.worker_timeout_s)" in message
    assert "  rank 0 on node1" in message and "failed after echo.double: WorkerError" in message


def test_a_rank_that_raised_is_the_cause_when_nobody_died(tmp_path):
    _status(
        tmp_path, 0, role="actor", method="actor.log_prob", state="failed", error="WorkerError: rank 1 failed"
    )
    _status(tmp_path, 1, role="actor", method="actor.log_prob", state="failed", error="KeyError: 'x'")
    lines = post_mortem(tmp_path, 1, "").splitlines()
    assert "rank 0" in lines[1] and "rank 1" in lines[2] and "KeyError" in lines[2]


def test_no_status_files_says_the_ranks_died_at_start(tmp_path):
    assert "no rank wrote a status file" in post_mortem(tmp_path / "none", 1, "")
