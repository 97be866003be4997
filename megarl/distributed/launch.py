"""Launch a megarl module on N local ranks with torchrun and collect what rank 0 reports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass

RESULT_PREFIX = "RESULT "


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, on `host` ("" = every interface)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LaunchResult:
    returncode: int
    results: list[dict]  # the JSON objects rank 0 printed after RESULT_PREFIX
    output: str  # everything the ranks printed (stdout + stderr)

    def failure_summary(self, lines: int = 25) -> str:
        """The ranks' own error lines, without torchrun's launcher traceback."""
        picked = [ln for ln in self.output.splitlines() if ln.startswith("[rank") or "Error" in ln]
        picked = [ln for ln in picked if "Warning" not in ln] or self.output.splitlines()
        return "\n".join(picked[-lines:])


def run_torchrun(module: str, args: list[str], nproc: int, timeout: float | None = None) -> LaunchResult:
    """Run `python -m module args` on `nproc` local ranks (gloo/nccl set up by the module itself)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        module,
        *args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    results = [
        json.loads(ln[len(RESULT_PREFIX) :])
        for ln in proc.stdout.splitlines()
        if ln.startswith(RESULT_PREFIX)
    ]
    return LaunchResult(proc.returncode, results, output)


def report(result: dict) -> None:
    """Rank code calls this to hand one JSON-serialisable result back to the launcher."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def report_from_rank_zero(result: dict) -> int:
    """Rank 0 hands `result` to the launcher and every rank waits for it; returns 0, the exit code."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        report(result)
    dist.barrier()
    return 0
