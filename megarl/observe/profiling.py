"""Per-rank profiles of chosen training steps: a torch.profiler chrome trace and each worker call's seconds.

    trainer.profile_steps=[3] trainer.profile_ranks=[0,1]

Around a profiled step the trainer calls `start_profile(step, out_dir, ranks)` and `stop_profile()` on
the actor's (and the critic's) worker group (`StepProfiler`, driver side). In each worker process
(`RANK_PROFILER`) every dispatched call in between is timed, on every rank, so a straggler shows; on the
chosen ranks torch.profiler also records CPU (and CUDA) activity. Under `<trainer.output_dir>/profile/step_<N>/`:

    rank_<r>.json          chrome trace of actor rank r (open in https://ui.perfetto.dev or chrome://tracing)
    critic_rank_<r>.json   the critic's, when it runs in processes of its own (Ray)
    stage_times.json       {"ranks": {role: {rank: {"<role>.<method>": seconds}}},
                            "spread": {role: {"<role>.<method>": slowest and fastest rank, seconds}}}

Roles sharing a process share its profile: the reference's calls are timed in the actor's processes,
and under torchrun (every role in every process) the actor's trace and times cover the critic too.
A Ray rank runs its calls one at a time on one thread, which is the thread torch.profiler follows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

UNTIMED = frozenset({"start_profile", "stop_profile"})  # the profiling calls themselves


def step_dir(output_dir: str | Path, step: int) -> Path:
    """`<output_dir>/profile/step_<step>`: where one step's traces and stage_times.json go."""
    return Path(output_dir) / "profile" / f"step_{step}"


def trace_name(role: str, rank: int) -> str:
    return f"rank_{rank}.json" if role == "actor" else f"{role}_rank_{rank}.json"


class RankProfiler:
    """One process's profile of one step: seconds per worker call, and a chrome trace when chosen.

    `start` while a profile is running returns False and changes nothing (a second role of the same
    process joins the first one's profile); only the role that started it stops it."""

    def __init__(self) -> None:
        self.owner: str | None = None
        self.seconds: dict[str, float] = {}
        self.trace_path: Path | None = None
        self._torch_profiler: Any = None

    @property
    def active(self) -> bool:
        return self.owner is not None

    def start(self, owner: str, trace_path: str | Path | None = None) -> bool:
        """Begin timing calls (and tracing to `trace_path` when given); False when one is running."""
        if self.active:
            return False
        torch_profiler = None
        if trace_path is not None:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            torch_profiler = profile(activities=activities, record_shapes=True)
            torch_profiler.start()
        self.owner, self.seconds, self._torch_profiler = owner, {}, torch_profiler
        self.trace_path = Path(trace_path) if trace_path is not None else None
        return True

    @contextmanager
    def timed(self, role: str, method: str) -> Iterator[None]:
        """Add the seconds inside the block to `<role>.<method>` while a profile runs (else free)."""
        if not self.active or method in UNTIMED:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            _synchronize()  # kernels the call queued belong to it
            name = f"{role}.{method}"
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def stop(self, owner: str) -> dict[str, float] | None:
        """End `owner`'s profile, writing the trace; its {"<role>.<method>": seconds}. None when
        `owner` did not start the running profile (or none runs)."""
        if self.owner != owner:
            return None
        try:
            if self._torch_profiler is not None:
                _synchronize()
                self._torch_profiler.stop()
                self.trace_path.parent.mkdir(parents=True, exist_ok=True)
                self._torch_profiler.export_chrome_trace(str(self.trace_path))
        finally:
            self.owner, self._torch_profiler = None, None
        return dict(self.seconds)


# The profile of this process: every worker call goes through `Worker.execute`, which times it here.
RANK_PROFILER = RankProfiler()


def merge_ranks(outputs: list[dict[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    """{rank: {call: seconds}} of a ONE_TO_ALL `stop_profile()` (one {rank: ...} dict per rank)."""
    merged = {}
    for output in outputs:
        merged.update(output)
    return dict(sorted(merged.items()))


def spread(ranks: dict[int, dict[str, float]]) -> dict[str, dict[str, float | int]]:
    """Per call, the slowest and fastest rank and their seconds."""
    calls = sorted({call for times in ranks.values() for call in times})
    out = {}
    for call in calls:
        timed = {rank: times[call] for rank, times in ranks.items() if call in times}
        slow, fast = max(timed, key=timed.get), min(timed, key=timed.get)
        out[call] = {
            "slowest_rank": slow,
            "slowest_s": timed[slow],
            "fastest_rank": fast,
            "fastest_s": timed[fast],
        }
    return out


def write_stage_times(out_dir: str | Path, step: int, roles: dict[str, dict[int, dict[str, float]]]) -> Path:
    """`<out_dir>/stage_times.json`; `roles` is {role: {rank: {call: seconds}}} (roles without times dropped)."""
    roles = {role: ranks for role, ranks in roles.items() if any(ranks.values())}
    path = Path(out_dir) / "stage_times.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "step": step,
        "ranks": {role: {str(r): t for r, t in ranks.items()} for role, ranks in roles.items()},
        "spread": {role: spread(ranks) for role, ranks in roles.items()},
    }
    path.write_text(json.dumps(record, indent=2))
    return path


class StepProfiler:
    """Driver side: profiles `steps` on worker groups ({role: group}) whose workers have
    `start_profile` / `stop_profile` (ONE_TO_ALL), tracing `ranks`."""

    def __init__(
        self, output_dir: str | Path, steps: list[int], ranks: list[int], groups: dict[str, Any], writer: bool
    ) -> None:
        self.output_dir, self.steps, self.ranks = Path(output_dir), set(steps), list(ranks)
        self.groups = {role: g for role, g in groups.items() if g is not None}
        self.writer = writer

    @classmethod
    def for_run(cls, cfg: Any, groups: dict[str, Any], writer: bool) -> StepProfiler:
        t = cfg.trainer
        return cls(t.output_dir, t.profile_steps, t.profile_ranks, groups, writer)

    @contextmanager
    def step(self, step: int) -> Iterator[Path | None]:
        """Profile the block when `step` is a profiled step; yields its directory (else None)."""
        if step not in self.steps or not self.groups:
            yield None
            return
        out = step_dir(self.output_dir, step)
        for group in self.groups.values():
            group.start_profile(step, str(out), self.ranks)
        yield out
        times = {role: merge_ranks(group.stop_profile()) for role, group in self.groups.items()}
        if self.writer:
            write_stage_times(out, step, times)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
