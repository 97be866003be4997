"""The comparative suites' shared measurements: a real child process tree's peak memory, its clean-up,
failures that name the log, and the spread of repeated numbers."""

from __future__ import annotations

import sys
import time

import psutil
import pytest

from megarl.bench.measure import peaks_by_label, run_measured, spread

# holds ~200 MiB for a second, and leaves a grandchild behind that would sleep for a minute
CHILD = """
import subprocess, sys, time
blob = bytearray(200 * 2**20)
for i in range(0, len(blob), 4096):
    blob[i] = 1
left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(left.pid, flush=True)
time.sleep(1.0)
"""


def test_peak_memory_of_the_tree_is_measured_and_nothing_is_left_behind(tmp_path):
    log = tmp_path / "child.log"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    measured = run_measured([sys.executable, str(script)], log)
    assert measured.peak_rss_bytes >= 190 * 2**20
    # per process: the script's own peak, named by its file; the idle grandchild is under 16 MiB
    assert list(measured.peak_by_process) == ["child.py"]
    assert 190 * 2**20 <= measured.peak_by_process["child.py"] <= measured.peak_rss_bytes
    assert measured.peak_rss_bytes < 2**30
    assert measured.seconds >= 1.0
    left = int(log.read_text().split()[0])
    deadline = time.monotonic() + 5
    while psutil.pid_exists(left) and psutil.Process(left).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {left} outlived the measured command"
        time.sleep(0.05)


def test_processes_running_the_same_module_are_numbered_in_start_order_and_many_are_one_entry():
    peaks = {30: 200 << 20, 10: 300 << 20, 20: 5 << 20, 40: 100 << 20}
    labels = {30: "megarl.train", 10: "megarl.train", 20: "megarl.rewards.pool", 40: "torchrun"}
    compilers = {100 + i: (50 + i) << 20 for i in range(6)}
    labels |= dict.fromkeys(compilers, "cc1plus")
    assert peaks_by_label(peaks | compilers, labels) == {
        "megarl.train#1": 300 << 20,
        "megarl.train#2": 200 << 20,
        "torchrun": 100 << 20,
        "cc1plus×6": 55 << 20,
    }


def test_a_failed_command_raises_with_its_exit_code_and_the_log(tmp_path):
    log = tmp_path / "fail.log"
    with pytest.raises(RuntimeError, match=r"exit 3; log .*fail\.log:\n.*no such model"):
        run_measured([sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"], log)


def test_a_command_past_its_time_limit_is_killed_and_named(tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1s"):
        run_measured(
            [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "slow.log", timeout_s=1
        )
    assert time.monotonic() - start < 15


def test_spread_is_the_median_and_range():
    assert spread([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}


def test_a_run_of_one_size_keeps_the_other_sizes_of_the_earlier_run(tmp_path):
    import json

    from megarl.bench.measure import merged_with_earlier

    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"steps": 3, "sizes": {"25m": {"old": 1}, "tiny": {"old": 1}}}))
    merged = merged_with_earlier(
        path, "sizes", {"steps": 5, "sizes": {"tiny": {"new": 1}}}, ["tiny", "3m", "25m"]
    )
    assert merged == {"steps": 5, "sizes": {"tiny": {"new": 1}, "25m": {"old": 1}}}
    assert list(merged["sizes"]) == ["tiny", "25m"]
    assert merged_with_earlier(tmp_path / "none.json", "sizes", {"sizes": {"a": 1}}, ["a"]) == {
        "sizes": {"a": 1}
    }
