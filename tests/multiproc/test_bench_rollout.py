"""`megarl bench rollout` end to end: the trainer's engines after a weight sync and standalone vLLM
engines replaying their calls sample the very same tokens, and the suite writes its JSON and table."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiproc


def test_bench_rollout_replays_the_trainers_calls_token_for_token(tmp_path):
    cmd = [sys.executable, "-m", "megarl.cli", "bench", "rollout", "--sizes", "tiny"]
    # --eager: the engines skip torch.compile's start-up; that pushed weights reach a compiled engine's graphs
    # is checked in test_vllm_rollout (test_load_weights_equals_an_engine_built_from_the_checkpoint)
    cmd += ["--warmup", "0", "--repeats", "2", "--eager", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    tiny = json.loads((tmp_path / "rollout.json").read_text())["sizes"]["tiny"]
    assert tiny["replicas"] == 2 and tiny["threads"] == 1
    # 8 prompts × 4 samples per call, 2 calls: the same weights (synced after an lr 1e-3 step) and
    # per-request seeds give the same samples in both engines
    assert tiny["samples"] == 64 and tiny["mismatched_samples"] == 0
    assert tiny["trainer_tokens_per_s"]["n"] == 2 and tiny["ratio"] > 0
    assert "| tiny (0.85M) | 2 × 1 | 8 × 4 × 32 |" in (tmp_path / "rollout.md").read_text()
