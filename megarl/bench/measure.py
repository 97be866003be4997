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
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class Measured:
    seconds: float
    peak_rss_bytes: int  # the largest sum of PSS over the command's process tree, sampled every 0.5 s
    # each process's own peak PSS (at its own moment), by `process_label`, largest first
    peak_by_process: dict[str, int] = field(default_factory=dict)


def tree_pss(proc: psutil.Process) -> dict[int, int]:
    """Resident memory of `proc` and each of its descendants by pid: their PSS (shared pages split among
    the processes sharing them, so libraries mapped by every worker count once; the sum is the tree's),
    RSS where the kernel has no smaps_rollup. Cheap enough to sample every 0.5 s (psutil's full smaps
    walk is not)."""
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    sizes = {}
    for p in family:
        try:
            sizes[p.pid] = _pss(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            pass
    return sizes


def process_label(pid: int) -> str:
    """What a process runs, short: the module after `-m`, else the script's or program's file name."""
    try:
        argv = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "exited"  # read again at the next sample: a process being exec'd has no cmdline yet
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    scripts = [a for a in argv[1:] if a.endswith(".py")]
    return Path(scripts[0] if scripts else argv[0] if argv else "?").name


def peaks_by_label(peaks: dict[int, int], labels: dict[int, str]) -> dict[str, int]:
    """Per-process peaks keyed by label, largest first; a few processes running the same thing are
    numbered in start order (`megarl.train#1`, `megarl.train#2`), many (the compiler jobs of an engine's
    first start) are one entry, their largest (`cc1plus×12`); those under 16 MiB are left out."""
    pids: dict[str, list[int]] = {}
    for pid in sorted(peaks):
        pids.setdefault(labels[pid], []).append(pid)
    named = {}
    for label, same in pids.items():
        if len(same) == 1:
            named[label] = peaks[same[0]]
        elif len(same) > 4:
            named[f"{label}×{len(same)}"] = max(peaks[pid] for pid in same)
        else:
            named.update({f"{label}#{i}": peaks[pid] for i, pid in enumerate(same, 1)})
    return dict(sorted(((k, v) for k, v in named.items() if v >= 16 << 20), key=lambda kv: -kv[1]))


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
    peaks: dict[int, int] = {}
    labels: dict[int, str] = {}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        proc = psutil.Process(child.pid)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.5):
                sizes = tree_pss(proc)
                peak = max(peak, sum(sizes.values()))
                for pid, size in sizes.items():
                    if labels.get(pid, "exited") == "exited":
                        labels[pid] = process_label(pid)
                    peaks[pid] = max(peaks.get(pid, 0), size)

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
    return Measured(seconds, peak, peaks_by_label(peaks, labels))


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
