"""`megarl bench reshard`: the 3D-HybridEngine transition on a real model, zero-redundancy vs naive.

Launches `--nproc` ranks, loads the HF checkpoint into Megatron at TP × PP (DP = the rest), builds the
generation plan for `--gen-tp`, and reshards the weights into generation-TP shards of HF tensors
(what the rollout engine loads) in buckets — pushed into a real vLLM engine with `--engine`. Reports per
rank: bytes received, the plan's floor and their ratio, seconds per phase (PP broadcast, micro-DP
gather, HF layout, engine load), and the peak extra memory over the transition (allocated on GPU; on
CPU the RSS, sampled at every bucket, in a separate run after the timed ones with glibc made to
return every freed tensor to the OS: see `megarl.bench.memory.exact_host_memory`). Both paths run
unless `--naive` or `--zero-only` picks one.

`--bucket-mib A B …` sweeps the zero-redundancy path over bucket sizes (peak memory vs time). With
`--engine` the transition is also compared with the restart it replaces: export the same weights as
safetensors and start a fresh engine from them. Writes `<out>/reshard.json` and `reshard.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from megarl.bench.memory import exact_host_memory, exact_host_memory_launch

# what the ranks read from the command line's settings
RANK_SETTINGS = (
    "hf",
    "tp",
    "pp",
    "gen_tp",
    "repeats",
    "dtype",
    "bucket_mib",
    "naive",
    "zero_only",
    "engine",
    "export_dir",
    "memory_run",
)


def transition(worker, plan, naive: bool, bucket_bytes: int, engine=None) -> dict:
    """One full reshard, each bucket pushed into `engine` (a VLLMRollout) or dropped; per-rank numbers."""
    from megarl.distributed.platform import platform
    from megarl.hybrid.reshard import Resharder, ReshardStats

    resharder = Resharder(worker.chunks, worker.arch, plan, bucket_bytes=bucket_bytes, naive=naive)
    stats = ReshardStats()
    platform().release_cached_memory()
    before = peak = platform().memory_in_use()
    start = time.perf_counter()
    for bucket in resharder.buckets(stats):
        peak = max(peak, platform().memory_in_use())
        if engine is not None:
            pushed = time.perf_counter()
            engine.load_weights(bucket)
            stats.seconds["engine_load"] = (
                stats.seconds.get("engine_load", 0.0) + time.perf_counter() - pushed
            )
            peak = max(peak, platform().memory_in_use())
        del bucket
    seconds = time.perf_counter() - start
    return {
        "received_bytes": stats.received_bytes,
        "floor_bytes": stats.floor_bytes,
        "ratio": stats.ratio,
        "seconds": seconds,
        "phase_seconds": stats.seconds,
        "peak_extra_bytes": peak - before,
        "largest_bucket_bytes": stats.largest_bucket_bytes,
    }


def bench_rank(spec: dict) -> dict:
    """The rank program (megarl.distributed.rank_program); `spec` holds the settings `run` passes."""
    import torch.distributed as dist

    from megarl.config.roles import role_spec, rollout_spec
    from megarl.config.schema import MegarlConfig
    from megarl.distributed.generation_plan import GenerationPlan
    from megarl.workers.reference import ReferenceWorker

    args = argparse.Namespace(**spec)
    if args.memory_run:  # before anything is allocated: the heap holds nothing from the default mode
        exact_host_memory()
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = args.hf, args.dtype
    cfg.actor.parallel.tp, cfg.actor.parallel.pp = args.tp, args.pp
    worker = ReferenceWorker(role_spec(cfg, "ref"))  # the weights are what matters; no optimizer needed
    plan = GenerationPlan.for_layout(worker.layout, args.gen_tp, worker.arch.num_kv_heads)
    engine = None
    if args.engine:
        from megarl.rollout.vllm import VLLMRollout

        cfg.rollout.tp, cfg.rollout.enforce_eager = args.gen_tp, True
        cfg.rollout.kv_cache_memory_bytes = 16 << 20
        cfg.data.max_prompt_length = cfg.data.max_response_length = 64
        engine = VLLMRollout(rollout_spec(cfg), tp_groups=plan.gen_tp_groups)
    paths = (
        ["naive"] if args.naive else ["zero_redundancy"] if args.zero_only else ["zero_redundancy", "naive"]
    )
    result = {"plan": plan.describe(), "model_bytes": _model_bytes(worker)}
    points = [
        (path, mib)
        for path in paths
        for mib in (args.bucket_mib if path == "zero_redundancy" else args.bucket_mib[:1])
    ]
    for path in paths:  # warm-up: first-use allocations (gloo buffers, engine scratch)
        transition(worker, plan, path == "naive", args.bucket_mib[0] << 20, engine)
    timed = {}
    for path, mib in points:
        repeats = 1 if args.memory_run else args.repeats
        runs = [transition(worker, plan, path == "naive", mib << 20, engine) for _ in range(repeats)]
        timed[path, mib] = {**runs[-1], "seconds": statistics.median(r["seconds"] for r in runs)}
    for path, mib in points:
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, timed[path, mib])
        result.setdefault("bucket_sweep", {}).setdefault(path, []).append(
            {"bucket_mib": mib, "ranks": everyone}
        )
        if mib == args.bucket_mib[0]:
            result[path] = everyone
    if engine is not None:
        engine.close()
        if not args.memory_run:
            result["fresh_engine"] = _fresh_engine(worker, cfg, plan, args.export_dir)
    return result


def _fresh_engine(worker, cfg, plan, export_dir: str) -> list[dict]:
    """The restart the transition replaces, per rank: export the weights as safetensors (collective),
    then start a new engine from them (the in-place engine closed first)."""
    import torch.distributed as dist

    from megarl.checkpoint.hf_export import export_hf
    from megarl.config.roles import rollout_spec
    from megarl.rollout.vllm import VLLMRollout

    dist.barrier()
    start = time.perf_counter()
    export_hf(worker.chunks, worker.arch, cfg.model.path, export_dir)
    dist.barrier()
    exported = time.perf_counter() - start
    cfg.model.path = export_dir
    start = time.perf_counter()
    engine = VLLMRollout(rollout_spec(cfg), tp_groups=plan.gen_tp_groups)
    started = time.perf_counter() - start
    engine.close()
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"export_seconds": exported, "start_seconds": started})
    return everyone


def _model_bytes(worker) -> int:
    """Bytes of the whole model (every TP shard of every stage once)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    local = sum(
        p.numel() * p.element_size()
        for c in worker.chunks
        for p in c.parameters()
        if not getattr(p, "shared", False) and param_is_not_tensor_parallel_duplicate(p)
    )
    total = torch.tensor([float(local)], dtype=torch.float64)
    dist.all_reduce(total, group=ps.get_model_parallel_group())
    return int(total.item())


def summarize(result: dict) -> str:
    lines = [result["plan"], f"model: {result['model_bytes'] / 2**20:.2f} MiB"]
    for path in ("zero_redundancy", "naive"):
        if path not in result:
            continue
        ranks = result[path]
        lines.append(f"{path}:")
        for rank, r in enumerate(ranks):
            phases = "  ".join(f"{k} {v * 1e3:.0f}" for k, v in r["phase_seconds"].items())
            lines.append(
                f"  rank {rank}: received {r['received_bytes'] / 2**20:8.3f} MiB  floor {r['floor_bytes'] / 2**20:8.3f} MiB"
                f"  ratio {r['ratio']:.2f}  {r['seconds'] * 1e3:7.1f} ms ({phases} ms)"
                f"  peak +{r['peak_extra_bytes'] / 2**20:.1f} MiB"
            )
    return "\n".join(lines)


def table(result: dict) -> str:
    """The markdown report: the slowest rank's numbers per bucket size, and the fresh-engine restart."""
    lines = [
        f"# megarl bench reshard — TP {result['tp']} × PP {result['pp']} → generation TP {result['gen_tp']}, "
        f"{result['nproc']} ranks",
        "",
        "```",
        result["plan"],
        "```",
        "",
        f"Model {result['model_bytes'] / 2**20:.1f} MiB. Seconds: median of the timed runs; peak extra memory over the "
        "transition (GPU: allocated; CPU: RSS with every freed tensor returned to the OS).",
        "",
        "| path | bucket MiB | received / floor | seconds (slowest rank) | peak extra MiB (largest rank) "
        "| largest bucket MiB |",
        "|---|---|---|---|---|---|",
    ]
    for path, sweep in result.get("bucket_sweep", {}).items():
        for point in sweep:
            ranks = point["ranks"]
            lines.append(
                f"| {path} | {point['bucket_mib']} | {max(r['ratio'] for r in ranks):.2f} "
                f"| {max(r['seconds'] for r in ranks):.3f} | {max(r['peak_extra_bytes'] for r in ranks) / 2**20:.1f} "
                f"| {max(r['largest_bucket_bytes'] for r in ranks) / 2**20:.1f} |"
            )
    fresh = result.get("fresh_engine")
    if fresh:  # the fastest bucket size of the sweep, as a user would set it
        best = min(
            result["bucket_sweep"]["zero_redundancy"], key=lambda p: max(r["seconds"] for r in p["ranks"])
        )
        transition = max(r["seconds"] for r in best["ranks"])
        export = max(r["export_seconds"] for r in fresh)
        start = max(r["start_seconds"] for r in fresh)
        lines += [
            "",
            "The restart the transition replaces: export the same weights as safetensors, start a fresh engine.",
            "",
            "| in-place transition s (bucket MiB) | export safetensors s | fresh engine start s | restart / transition |",
            "|---|---|---|---|",
            f"| {transition:.3f} ({best['bucket_mib']}) | {export:.3f} | {start:.3f} "
            f"| **{(export + start) / transition:.1f}×** |",
        ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict:
    import json
    import tempfile
    from pathlib import Path

    from megarl.distributed.platform import platform
    from megarl.distributed.rank_program import launch_rank_program

    def launch(memory_run: bool) -> dict:
        exact = exact_host_memory_launch() if memory_run else contextlib.nullcontext()
        with tempfile.TemporaryDirectory(prefix="megarl-reshard-export-") as export_dir, exact:
            spec = {
                name: getattr(args, name)
                for name in RANK_SETTINGS
                if name not in ("export_dir", "memory_run")
            }
            spec.update(export_dir=f"{export_dir}/hf", memory_run=memory_run)
            ranks = launch_rank_program("megarl.bench.reshard:bench_rank", spec, nproc=args.nproc)
        if not ranks.results:
            raise RuntimeError(f"reshard benchmark failed:\n{ranks.failure_summary()}")
        return ranks.results[0]

    result = {"nproc": args.nproc, "tp": args.tp, "pp": args.pp, "gen_tp": args.gen_tp, **launch(False)}
    if not platform().is_cuda and not args.no_memory_run:  # CPU: peak memory from a run of its own
        memory = launch(True)["bucket_sweep"]
        for path, sweep in result["bucket_sweep"].items():
            for point, measured in zip(sweep, memory[path]):
                for rank, peak in zip(point["ranks"], measured["ranks"]):
                    rank["peak_extra_bytes"] = peak["peak_extra_bytes"]
            result[path] = sweep[0]["ranks"]  # the headline: the first bucket size
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reshard.json").write_text(json.dumps(result, indent=2))
    (out / "reshard.md").write_text(table(result))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf", required=True, help="HF checkpoint dir")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--gen-tp", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--naive", action="store_true", help="only the naive full all-gather path")
    parser.add_argument("--zero-only", action="store_true", help="only the zero-redundancy path")
    parser.add_argument(
        "--bucket-mib",
        type=int,
        nargs="+",
        default=[64],
        help="bucket sizes; several sweep the zero-redundancy path",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument(
        "--engine",
        action="store_true",
        help="push every bucket into a vLLM engine; compare a fresh engine start",
    )
    parser.add_argument(
        "--no-memory-run",
        action="store_true",
        help="CPU: skip the second launch that measures the peak extra memory exactly (the peak is then the "
        "timed runs' RSS, which counts freed buffers glibc keeps)",
    )
    parser.add_argument("--out", default="outputs/bench", help="writes reshard.json and reshard.md here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
