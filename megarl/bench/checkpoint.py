"""`megarl bench checkpoint`: save and load a trained role's full checkpoint on a ~100M-parameter Llama.

Builds the model locally (random weights), starts an actor worker on `--nproc` ranks at `--tp` (DP = the
rest, distributed optimizer on), takes one optimizer step so the Adam state exists, then times
`save_checkpoint`, the manifest verification alone, and `load_checkpoint` (verification included).
The floor it is measured against: fp32 parameters plus two fp32 Adam moments, 12 bytes per parameter.
Writes JSON to `--out` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

RANK_SETTINGS = ("hf", "tp", "dir", "repeats")
# ≈ 98M parameters: 12 layers of hidden 768 (12 heads, ffn 2048) and an untied 8192-token vocabulary.
MODEL = dict(
    hidden_size=768,
    num_hidden_layers=12,
    intermediate_size=2048,
    num_attention_heads=12,
    num_key_value_heads=12,
    vocab_size=8192,
)


def bench_rank(spec: dict) -> dict:
    """The rank program (megarl.distributed.rank_program); `spec` holds the settings `run` passes."""
    import torch
    import torch.distributed as dist

    from megarl.checkpoint.manifest import read_manifest, verify_collective
    from megarl.config.roles import role_spec
    from megarl.config.schema import MegarlConfig
    from megarl.models.forward import run_microbatches, vocab_parallel_log_probs
    from megarl.workers.actor import ActorWorker

    args = argparse.Namespace(**spec)
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = args.hf, "fp32"
    cfg.actor.parallel.tp = args.tp
    cfg.actor.optimizer.lr = 1e-5
    worker = ActorWorker(role_spec(cfg, "actor"))
    tokens = torch.randint(0, worker.arch.vocab_size, (1, 65), generator=torch.Generator().manual_seed(0))
    mbs = [{"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}]

    def loss_fn(mb, out):
        return -vocab_parallel_log_probs(out, mb["labels"], worker.arch.vocab_size).mean(), {}

    worker.optimizer.zero_grad()
    run_microbatches(worker.chunks, mbs, loss_fn, forward_only=False)
    worker.optimizer.step()

    runs = []
    for i in range(args.repeats):
        role_dir = Path(args.dir) / f"run_{i}"
        dist.barrier()
        start = time.perf_counter()
        saved = worker.save_checkpoint(str(role_dir))
        dist.barrier()
        save_s = time.perf_counter() - start
        manifest = read_manifest(role_dir)
        start = time.perf_counter()
        verify_collective(role_dir, manifest)
        verify_s = time.perf_counter() - start
        dist.barrier()
        start = time.perf_counter()
        report = worker.load_checkpoint(str(role_dir))
        dist.barrier()
        load_s = time.perf_counter() - start
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, saved["bytes_written"])
        runs.append(
            {
                "save_seconds": save_s,
                "verify_seconds": verify_s,
                "load_seconds": load_s,
                "bytes_on_disk": sum(e["size"] for e in manifest["files"]),
                "bytes_written_per_rank": everyone,
                "files": len(manifest["files"]),
                "optimizer": report["optimizer"],
                "rng": report["rng"],
            }
        )
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(role_dir)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    params = sum(
        p.numel()
        for c in worker.chunks
        for p in c.module.parameters()
        if param_is_not_tensor_parallel_duplicate(p)
    )
    total = torch.tensor([float(params)], dtype=torch.float64)
    dist.all_reduce(total, group=ps.get_model_parallel_group())
    return {
        "layout": worker.layout.describe(),
        "parameters": int(total.item()),
        "runs": runs,
    }


def summarize(result: dict) -> str:
    best = {k: min(r[k] for r in result["runs"]) for k in ("save_seconds", "verify_seconds", "load_seconds")}
    run = result["runs"][-1]
    floor = result["param_bytes"] + result["optimizer_bytes"]
    mib = 2**20
    lines = [
        f"role checkpoint, {result['parameters'] / 1e6:.1f}M-parameter Llama, {result['layout']} "
        f"({result['nproc']} ranks, CPU), best of {len(result['runs'])}",
        "",
        "| what | value |",
        "|---|---|",
        f"| save | {best['save_seconds']:.2f} s ({run['bytes_on_disk'] / mib / best['save_seconds']:.0f} MiB/s) |",
        f"| verify (sizes + CRC-32, split over ranks) | {best['verify_seconds']:.2f} s |",
        f"| load (verification included) | {best['load_seconds']:.2f} s |",
        f"| bytes on disk | {run['bytes_on_disk'] / mib:.1f} MiB in {run['files']} files |",
        f"| fp32 params + 2 Adam moments | {floor / mib:.1f} MiB "
        f"({result['param_bytes'] / mib:.1f} + {result['optimizer_bytes'] / mib:.1f}) |",
        f"| on disk / floor | {run['bytes_on_disk'] / floor:.3f} |",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
    from megarl.distributed.rank_program import launch_rank_program
    from megarl.models.tiny import build_tiny_hf

    work = Path(tempfile.mkdtemp(prefix="megarl-bench-ckpt-"))
    try:
        hf = args.hf or str(build_tiny_hf(work / "llama", family="llama", **MODEL))
        spec = {"hf": hf, "tp": args.tp, "dir": str(work / "ckpt"), "repeats": args.repeats}
        launch = launch_rank_program("megarl.bench.checkpoint:bench_rank", spec, nproc=args.nproc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not launch.results:
        raise RuntimeError(f"checkpoint benchmark failed:\n{launch.failure_summary()}")
    rank0 = launch.results[0]
    result = {
        "what": "save / verify / load of a trained actor's role checkpoint (weights, Adam state, RNG)",
        "nproc": args.nproc,
        "tp": args.tp,
        **rank0,
        "param_bytes": 4 * rank0["parameters"],
        "optimizer_bytes": 8 * rank0["parameters"],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(summarize(result) + "\n")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf", default=None, help="HF checkpoint dir (default: a ~100M Llama built here)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (DP = nproc / tp)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench/checkpoint.json")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
