"""redirect_output: a process's stdout and stderr, C-level writes included, go to its log; megarl's own
lines still reach the console; the known third-party warnings are filtered."""

import subprocess
import sys
import textwrap

import pytest

from megarl.observe.worker_logs import log_file, logs_dir

pytestmark = pytest.mark.unit

_PROGRAM = textwrap.dedent(
    """
    import os, sys, warnings
    from megarl.observe.worker_logs import console, console_errors, quiet_known_warnings, redirect_output

    print("before the redirect")
    redirect_output(sys.argv[1], keep_console=sys.argv[2] == "keep")
    quiet_known_warnings()
    print("library print")
    os.write(1, b"C-level stdout\\n")
    os.write(2, b"C-level stderr\\n")
    warnings.warn("a library's own warning")
    warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
    warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated.", FutureWarning)
    print("step 1/2 | megarl's line", file=console())
    print("megarl train: an error", file=console_errors())
    """
)


def _run(tmp_path, keep: str) -> tuple[subprocess.CompletedProcess, str]:
    log = log_file(logs_dir(tmp_path), "actor", 1)
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(log), keep], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc, log.read_text()


def test_output_goes_to_the_log_and_megarls_lines_to_the_console(tmp_path):
    assert log_file(logs_dir(tmp_path), "actor", 1) == tmp_path / "logs" / "actor_rank1.log"
    proc, log = _run(tmp_path, "keep")
    assert proc.stdout.splitlines() == ["before the redirect", "step 1/2 | megarl's line"]
    assert proc.stderr.splitlines() == ["megarl train: an error"]
    for line in ("library print", "C-level stdout", "C-level stderr", "a library's own warning"):
        assert line in log
    assert "Transformer Engine" not in log and "deprecated" not in log and "megarl's line" not in log


def test_without_keep_console_everything_goes_to_the_log(tmp_path):
    proc, log = _run(tmp_path, "no")
    assert proc.stdout == "before the redirect\n" and proc.stderr == ""
    assert "megarl's line" in log and "megarl train: an error" in log


_RANK_PROGRAM = textwrap.dedent(
    """
    import logging, sys
    from megarl.observe.worker_logs import rank_output_to_log

    rank_output_to_log(sys.argv[1], int(sys.argv[2]))
    logging.getLogger("megarl.data").warning("data.train_files: dropped 1 prompt ...")
    logging.getLogger("vllm").warning("a library's logged warning")
    """
)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_torchrun_ranks_data_warnings_reach_the_console_once(tmp_path, rank):
    proc = subprocess.run(
        [sys.executable, "-c", _RANK_PROGRAM, str(tmp_path), str(rank)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    shown = ["data.train_files: dropped 1 prompt ..."] if rank == 0 else []
    assert proc.stderr.splitlines() == shown and proc.stdout == ""
    assert "a library's logged warning" in log_file(logs_dir(tmp_path), "actor", rank).read_text()
