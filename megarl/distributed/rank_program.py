"""One harness for the code that runs on every rank under torchrun: verify, convert, the benchmarks and
the multi-process test checks.

A rank program is a function `fn(spec) -> dict | list[dict]`, named "package.module:function"
(":main" when the function is left out). `spec` is any JSON value the launcher chose: an argv list for
programs that parse flags, a dict of settings otherwise.

    launch_rank_program("megarl.models.verify", ["--hf", path], nproc=4).results

starts `python -m megarl.distributed.rank_program` on `nproc` local ranks. On each rank the harness
initialises torch.distributed from torchrun's environment, calls the function, and rank 0 writes what it
returned to the report file; every rank then meets at a barrier, tears down megatron's groups and the
process group, and exits 0, or 1 when a returned result says `"passed": false`. A rank whose function
raises writes its error beside the report and exits 1 at once, without the barrier: the other ranks may
be inside a collective, and torchrun stops them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megarl.distributed.launch import run_torchrun

REPORT_FILE = "report.json"

Spec = list[str] | dict[str, Any]


@dataclass
class LaunchResult:
    returncode: int
    results: list[dict]  # what the function returned on rank 0 (a single dict becomes a list of one)
    output: str  # everything the ranks printed (stdout + stderr)
    errors: list[dict] = field(default_factory=list)  # {"rank", "error", "traceback"} per rank that raised

    def failure_summary(self, lines: int = 25) -> str:
        """The ranks' own errors (the lowest rank's traceback, then one line per rank), or failing that
        their error lines from the output, without torchrun's launcher traceback."""
        if self.errors:
            tail = self.errors[0]["traceback"].rstrip().splitlines()[-lines:]
            return "\n".join([*tail, *(f"[rank {e['rank']}] {e['error']}" for e in self.errors)])
        picked = [ln for ln in self.output.splitlines() if ln.startswith("[rank") or "Error" in ln]
        picked = [ln for ln in picked if "Warning" not in ln] or self.output.splitlines()
        return "\n".join(picked[-lines:])


def launch_rank_program(target: str, spec: Spec, nproc: int, timeout: float | None = None) -> LaunchResult:
    """Run the rank program `target` ("module:function") with `spec` on `nproc` local ranks."""
    with tempfile.TemporaryDirectory(prefix="megarl-ranks-") as report_dir:
        args = [target, json.dumps(spec, default=str), "--report-dir", report_dir]
        proc = run_torchrun("megarl.distributed.rank_program", args, nproc, timeout=timeout)
        report = Path(report_dir) / REPORT_FILE
        results = json.loads(report.read_text()) if report.is_file() else []
        errors = [json.loads(p.read_text()) for p in Path(report_dir).glob("error-rank*.json")]
    errors.sort(key=lambda e: e["rank"])
    return LaunchResult(proc.returncode, results, proc.stdout + proc.stderr, errors)


def find_rank_function(target: str) -> Callable[[Spec], dict | list[dict]]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name or "main")


def run_rank_program(fn: Callable[[Spec], dict | list[dict]], spec: Spec, report_dir: Path) -> int:
    """This rank's part: init, run `fn(spec)`, report from rank 0, barrier, tear down; the exit code."""
    import torch.distributed as dist

    from megarl.distributed.backend import init_distributed
    from megarl.distributed.layout import ParallelLayout

    env = init_distributed()
    try:
        outcome = fn(spec)
    except Exception as e:
        traceback.print_exc()
        error = {"rank": env.rank, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        (report_dir / f"error-rank{env.rank}.json").write_text(json.dumps(error))
        return 1
    results = outcome if isinstance(outcome, list) else [outcome]
    if env.rank == 0:
        staging = report_dir / f"{REPORT_FILE}.partial"
        staging.write_text(json.dumps(results))
        staging.rename(report_dir / REPORT_FILE)  # the launcher never reads half a report
    if dist.is_initialized():  # a rank program may have ended its own process group
        dist.barrier()
        if ParallelLayout.active() is not None:
            ParallelLayout.destroy()
        dist.destroy_process_group()
    return 1 if any(isinstance(r, dict) and r.get("passed") is False for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one rank of a rank program (torchrun starts this)")
    parser.add_argument("target", help="package.module[:function], the function defaulting to main")
    parser.add_argument("spec", help="the JSON value passed to the function")
    parser.add_argument("--report-dir", required=True, type=Path)
    args = parser.parse_args(argv)

    def fn(spec: Spec) -> dict | list[dict]:
        return find_rank_function(args.target)(spec)  # looked up inside, so an ImportError is reported

    return run_rank_program(fn, json.loads(args.spec), args.report_dir)


if __name__ == "__main__":
    sys.exit(main())
