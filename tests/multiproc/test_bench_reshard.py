"""`megarl bench reshard` end to end: its own ranks, JSON out, zero-redundancy at the floor, naive above,
the bucket-size sweep, and the fresh-engine restart it is compared with."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiproc


def _bench(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "megarl.cli", "bench", "reshard", *args, "--repeats", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_bench_reshard_reports_floor_ratio_phases_and_the_bucket_sweep(tiny_models, tmp_path):
    result = _bench(
        ["--hf", str(tiny_models["qwen2"]), "--tp", "4", "--gen-tp", "2", "--nproc", "4"]
        + ["--bucket-mib", "1", "64", "--out", str(tmp_path)]
    )
    assert [r["ratio"] for r in result["zero_redundancy"]] == [1.0] * 4
    assert [round(r["ratio"], 2) for r in result["naive"]] == [
        3.0
    ] * 4  # (1 - 1/t) / (1/t_g - 1/t) = 3 at t=4, t_g=2
    for r in result["zero_redundancy"]:
        assert set(r["phase_seconds"]) == {"pp_broadcast", "gather", "to_hf"}
        assert r["largest_bucket_bytes"] > 0
    sweep = result["bucket_sweep"]["zero_redundancy"]
    assert [p["bucket_mib"] for p in sweep] == [1, 64]
    assert sweep[0]["ranks"] == result["zero_redundancy"]  # the first bucket size is the headline
    small, large = (max(r["largest_bucket_bytes"] for r in p["ranks"]) for p in sweep)
    assert small < large  # the tiny model's embedding alone is above 1 MiB, the rest bucketed smaller
    assert [p["bucket_mib"] for p in result["bucket_sweep"]["naive"]] == [1]
    assert json.loads((tmp_path / "reshard.json").read_text())["bucket_sweep"] == result["bucket_sweep"]
    assert "| zero_redundancy | 64 | 1.00 |" in (tmp_path / "reshard.md").read_text()


def test_bench_reshard_into_an_engine_is_compared_with_a_fresh_engine_from_safetensors(tiny_models, tmp_path):
    # --no-memory-run: one launch, not two (nothing here reads the peak memory; the test above runs the
    # CPU's exact-memory launch and its merge)
    result = _bench(
        ["--hf", str(tiny_models["llama"]), "--tp", "2", "--gen-tp", "1", "--nproc", "2"]
        + ["--zero-only", "--engine", "--no-memory-run", "--out", str(tmp_path)]
    )
    [r] = {r["ratio"] for r in result["zero_redundancy"]}
    assert r == 1.0 and all(r["phase_seconds"]["engine_load"] > 0 for r in result["zero_redundancy"])
    fresh = result["fresh_engine"]
    assert len(fresh) == 2 and all(f["export_seconds"] > 0 and f["start_seconds"] > 0 for f in fresh)
    assert (
        "| in-place transition s (bucket MiB) | export safetensors s | fresh engine start s |"
        in (tmp_path / "reshard.md").read_text()
    )
