"""`megarl bench train` end to end on the tiny size: both sides time the same update, the shims' share
is counted, and on CPU there is no MFU (no peak to divide by)."""

import json
import subprocess
import sys

import pytest

from megarl.models.cpu_gemm import openblas_chosen

pytestmark = pytest.mark.multiproc


def test_bench_train_times_megatron_and_transformers_on_the_same_batch(tmp_path):
    cmd = [sys.executable, "-m", "megarl.cli", "bench", "train", "--sizes", "tiny", "--sequences", "4"]
    cmd += [
        "--prompt-len",
        "8",
        "--response-len",
        "8",
        "--warmup",
        "0",
        "--repeats",
        "2",
        "--out",
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    tiny = json.loads((tmp_path / "train.json").read_text())["sizes"]["tiny"]
    assert tiny["tokens"] == 4 * 16 and tiny["device"] == "cpu" and tiny["mfu"] is None
    assert tiny["megatron"]["n"] == 2 and tiny["transformers"]["n"] == 2
    assert tiny["shim"]["intercepted_calls"] > 0 and tiny["model_flops"] > 0
    gemm = "openblas" if openblas_chosen() else "torch"  # the rank decides as this process would
    assert tiny["gemm"] == gemm
    assert (
        f"| tiny (0.85M) | cpu, fp32, Megatron's GEMM: {gemm} | 64 |" in (tmp_path / "train.md").read_text()
    )
