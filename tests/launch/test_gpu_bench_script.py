"""tools/gpu_bench.sh's CPU dry run: every stage of the GPU benchmark (parity and train in bf16 and fp32,
train with the FSDP backend) runs at the tiny size and lands in the one JSON, so the script's plumbing
is proven before a GPU is lent to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc

ROOT = Path(__file__).resolve().parents[2]
STAGES = {"parity-bf16", "parity-fp32", "train-bf16", "train-fp32"}


def test_gpu_bench_dry_run_runs_every_stage(tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "PYTHON": sys.executable,
    }
    run = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_bench.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "gpu_bench.json").read_text())
    assert report["mode"] == "dry-run"
    assert set(report["stages"]) == STAGES
    for name, stage in report["stages"].items():
        assert stage["status"] == "ok", (name, stage["error"])
    for dtype in ("bf16", "fp32"):
        assert [(r["dtype"], r["passed"]) for r in report["stages"][f"parity-{dtype}"]["result"]] == [
            (dtype, True)
        ]
        tiny = report["stages"][f"train-{dtype}"]["result"]["sizes"]["tiny"]
        assert tiny["dtype"] == dtype and tiny["megatron"]["tokens_per_s"] > 0 and "fsdp" in tiny
