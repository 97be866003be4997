"""`megarl bench train --backend fsdp` end to end on the tiny size: Megatron, transformers and megarl's
FSDP actor time the same update, the shims' share is counted, each side's peak memory is measured, the
two actors' first updates agree (equal work), and on CPU there is no MFU (no peak to divide by)."""

import json
import subprocess
import sys

import pytest

from megarl.models.cpu_gemm import openblas_chosen

pytestmark = pytest.mark.multiproc


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def test_bench_train_times_megatron_transformers_and_fsdp_on_the_same_batch(tmp_path):
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
        "--backend",
        "fsdp",
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
    md = (tmp_path / "train.md").read_text()
    assert f"| tiny (0.85M) | cpu, fp32, Megatron's GEMM: {gemm} | 64 |" in md
    fsdp = tiny["fsdp"]
    assert fsdp["n"] == 2 and fsdp["tokens_per_s"] == pytest.approx(64 / fsdp["median"])
    ratio = tiny["megatron"]["median"] / fsdp["median"]
    assert fsdp["ratio_tokens_per_s_vs_megatron"] == pytest.approx(ratio)
    # equal work: both actors load the same weights, so their first updates agree (grad_norm reads them)
    first = fsdp["first_update"]
    assert rel(first["fsdp"]["pg_loss"], first["megatron"]["pg_loss"]) < 1e-5
    assert rel(first["fsdp"]["grad_norm"], first["megatron"]["grad_norm"]) < 1e-5
    # peak memory of each side: the resident set's growth, at least the fp32 weights (0.85M × 4 bytes)
    memory = tiny["memory"]
    for side in ("megatron", "transformers", "fsdp"):
        assert memory[side]["method"] == "VmHWM after clear_refs"
        assert memory[side]["peak_bytes"] >= 0.85e6 * 4, (side, memory[side])
    row = next(
        line for line in md.splitlines() if line.startswith("| tiny") and "×** | " in line and "VmHWM" in line
    )
    mib = " / ".join(f"{memory[s]['peak_bytes'] / 2**20:,.0f}" for s in ("megatron", "fsdp", "transformers"))
    assert f"| {fsdp['tokens_per_s']:.0f} |" in row and f"**{ratio:.2f}×**" in row and f"| {mib} |" in row
