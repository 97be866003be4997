"""`megarl parity-check`: Megatron against transformers, and the checkpoint round trip, on a CPU.

1. build tiny Llama and Qwen2 checkpoints offline (random weights, locally trained tokenizer);
2. load each into megatron at TP1, TP2, PP2 and TP2xPP2 (4 ranks, gloo) and compare logits, loss and
   every gradient with Hugging Face transformers in fp32;
3. convert Qwen2 HF -> megatron dist-checkpoint at TP2xPP2 -> HF and check the round trip is bit-exact.
Writes `<out>/summary.json`; exits non-zero if any check fails.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from megarl.distributed.rank_program import launch_rank_program

LAYOUTS = "tp1pp1,tp2pp1,tp1pp2,tp2pp2"


def _step(n: int, text: str) -> float:
    print(f"[{n}/3] {text}", flush=True)
    return time.perf_counter()


def round_trip_identical(a_dir: Path, b_dir: Path) -> bool:
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def run_parity_check(out: Path) -> int:
    from megarl.models.tiny import build_tiny_hf

    shutil.rmtree(out, ignore_errors=True)
    summary: dict = {"checks": []}
    start = _step(1, f"building tiny llama and qwen2 checkpoints under {out}/models")
    # initializer_range 0.1 (not HF's 0.02) gives logits of magnitude ~5, so the comparison means something.
    models = {
        family: build_tiny_hf(out / "models" / family, family=family, initializer_range=0.1)
        for family in ("llama", "qwen2")
    }
    print(f"      done in {time.perf_counter() - start:.1f}s")

    start = _step(2, f"megatron vs transformers at {LAYOUTS} on 4 ranks (gloo, fp32)")
    args = [a for path in models.values() for a in ("--hf", str(path))] + ["--layouts", LAYOUTS]
    verify = launch_rank_program("megarl.models.verify", args, nproc=4)
    if not verify.results:
        print(verify.failure_summary())
        return 1
    for r in verify.results:
        print(
            f"      {r['family']:6s} {r['layout']:14s} max|Δlogits| {r['max_abs_logit_diff']:.1e} "
            f"(of max|logits| {r['hf_logits_abs_max']:.1f})  "
            f"|Δloss| {r['loss_abs_diff']:.1e}  max|Δgrad| {r['max_abs_grad_diff']:.1e}  "
            f"{'OK' if r['passed'] else 'FAILED'}"
        )
        summary["checks"].append({"check": "parity", **r})
    print(f"      done in {time.perf_counter() - start:.1f}s")

    start = _step(3, "qwen2: HF -> megatron dist-checkpoint (TP2xPP2) -> HF")
    ckpt, back = out / "qwen2_mcore_tp2pp2", out / "qwen2_hf_roundtrip"
    to_mcore = launch_rank_program(
        "megarl.checkpoint.convert_program",
        ["hf-to-mcore", "--hf", str(models["qwen2"]), "--out", str(ckpt), "--tp", "2", "--pp", "2"],
        nproc=4,
    )
    to_hf = launch_rank_program(
        "megarl.checkpoint.convert_program", ["mcore-to-hf", "--ckpt", str(ckpt), "--out", str(back)], 1
    )
    identical = (
        to_mcore.returncode == 0 and to_hf.returncode == 0 and round_trip_identical(models["qwen2"], back)
    )
    if to_mcore.returncode or to_hf.returncode:
        print((to_mcore if to_mcore.returncode else to_hf).failure_summary())
    print(f"      round trip bit-exact: {identical}; done in {time.perf_counter() - start:.1f}s")
    summary["checks"].append({"check": "round_trip_bit_exact", "passed": identical, "checkpoint": str(ckpt)})

    passed = all(c["passed"] for c in summary["checks"])
    summary["passed"] = passed
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{'ALL CHECKS PASSED' if passed else 'SOME CHECKS FAILED'} — summary: {out / 'summary.json'}")
    return 0 if passed else 1
