"""What the comparative suites measure the same way on every side: a command's process tree (peak RSS,
wall time, its log on failure) and the median / spread of repeated numbers."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass
class Measured:
    seconds: float
    peak_rss_bytes: int  # the largest sum of PSS over the command's process tree, sampled every 0.5 s


def tree_rss(proc: psutil.Process) -> int:
    """Resident memory of `proc` and its descendants: the sum of their PSS (shared pages split among
    the processes sharing them, so libraries mapped by every worker count once), RSS where the kernel
    has no smaps_rollup. Cheap enough to sample every 0.5 s (psutil's full smaps walk is not)."""
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in family:
        try:
            total += _pss(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            pass
    return total


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (PermissionError, FileNotFoundError):
        pass
    return psutil.Process(pid).memory_info().rss


def run_measured(
    cmd: list[str], log_path: Path, env: dict | None = None, timeout_s: float = 3600
) -> Measured:
    """Run `cmd` (stdout+stderr to `log_path`) while sampling its process tree's RSS; raise naming the
    log on a non-zero exit or time-out (the tree is killed: nothing is left behind)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    peak = 0
    start = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        proc = psutil.Process(child.pid)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.5):
                peak = max(peak, tree_rss(proc))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            done.set()
            sampler.join()
            _kill_tree(proc)
    seconds = time.perf_counter() - start
    if code != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        why = f"timed out after {timeout_s:.0f}s" if code is None else f"exit {code}"
        raise RuntimeError(f"bench: {' '.join(cmd[:4])} … {why}; log {log_path}:\n{tail}")
    return Measured(seconds, peak)


def _kill_tree(proc: psutil.Process) -> None:
    """Kill the command's session (its process group: also what outlived the command) and its tree."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def merged_with_earlier(path: Path, key: str, result: dict, order: list[str]) -> dict:
    """`result` with the entries of `result[key]` that `path` (an earlier run's JSON) has and this run
    did not measure kept, in `order`: running one size or axis at a time builds up the whole table."""
    earlier = json.loads(path.read_text()).get(key, {}) if path.exists() else {}
    entries = {**earlier, **result[key]}
    return {**result, key: {k: entries[k] for k in order if k in entries}}


def write_merged(path: Path, key: str, result: dict, order: list[str], table) -> dict:
    """Write `result` merged with the earlier run's entries (merged_with_earlier) as `path` (JSON) and
    its `table(...)` as the .md beside it; returns the merged result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = merged_with_earlier(path, key, result, order)
    path.write_text(json.dumps(merged, indent=2))
    path.with_suffix(".md").write_text(table(merged))
    return merged


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def spread_text(s: dict, fmt: str = "{:.2f}") -> str:
    """A spread as a table cell: "median (min–max)"."""
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"
