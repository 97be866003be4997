"""Start a module on N local ranks with torchrun (megarl.distributed.rank_program builds on this)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, on `host` ("" = every interface)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_torchrun(
    module: str, args: list[str], nproc: int, timeout: float | None = None
) -> subprocess.CompletedProcess:
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
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
