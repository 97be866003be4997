"""`megarl bench reshard` end to end: its own ranks, JSON out, zero-redundancy at the floor, naive above."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiproc


def test_bench_reshard_reports_floor_ratio_and_phases(tiny_models):
    cmd = [sys.executable, "-m", "megarl.cli", "bench", "reshard", "--hf", str(tiny_models["qwen2"])]
    cmd += ["--tp", "4", "--gen-tp", "2", "--nproc", "4", "--repeats", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert [r["ratio"] for r in result["zero_redundancy"]] == [1.0] * 4
    assert [round(r["ratio"], 2) for r in result["naive"]] == [
        3.0
    ] * 4  # (1 - 1/t) / (1/t_g - 1/t) = 3 at t=4, t_g=2
    for r in result["zero_redundancy"]:
        assert set(r["phase_seconds"]) == {"pp_broadcast", "gather", "to_hf"}
        assert r["largest_bucket_bytes"] > 0
