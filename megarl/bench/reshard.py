"""`megarl bench reshard`: the 3D-HybridEngine transition on a real model, zero-redundancy vs naive.

Launches `--nproc` ranks, loads the HF checkpoint into Megatron at TP × PP (DP = the rest), builds the
generation plan for `--gen-tp`, and reshards the weights into generation-TP shards of HF tensors
(what the rollout engine loads) in buckets — pushed into a real vLLM engine with `--engine`. Reports per rank: bytes received, the plan's floor and
their ratio, seconds per phase (PP broadcast, micro-DP gather, HF layout), and the peak extra memory
over the transition (RSS on CPU, allocated on GPU). Both paths run unless `--naive` or `--zero-only`
picks one.
"""

from __future__ import annotations

import argparse
import statistics
import time

# what the ranks read from the command line's settings
RANK_SETTINGS = ("hf", "tp", "pp", "gen_tp", "repeats", "dtype", "bucket_mib", "naive", "zero_only", "engine")


def transition(worker, plan, naive: bool, bucket_bytes: int, engine=None) -> dict:
    """One full reshard, each bucket pushed into `engine` (a VLLMRollout) or dropped; per-rank numbers."""
    from megarl.distributed.platform import platform
    from megarl.hybrid.reshard import Resharder, ReshardStats

    resharder = Resharder(worker.chunks, worker.arch, plan, bucket_bytes=bucket_bytes, naive=naive)
    stats = ReshardStats()
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
    for path in paths:
        runs = [
            transition(worker, plan, path == "naive", args.bucket_mib << 20, engine)
            for _ in range(args.repeats)
        ]
        mine = {**runs[-1], "seconds": statistics.median(r["seconds"] for r in runs)}
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        result[path] = everyone
    if engine is not None:
        engine.close()
    return result


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


def run(args: argparse.Namespace) -> dict:
    from megarl.distributed.rank_program import launch_rank_program

    spec = {name: getattr(args, name) for name in RANK_SETTINGS}
    launch = launch_rank_program("megarl.bench.reshard:bench_rank", spec, nproc=args.nproc)
    if not launch.results:
        raise RuntimeError(f"reshard benchmark failed:\n{launch.failure_summary()}")
    return {"nproc": args.nproc, "tp": args.tp, "pp": args.pp, "gen_tp": args.gen_tp, **launch.results[0]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf", required=True, help="HF checkpoint dir")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--gen-tp", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--naive", action="store_true", help="only the naive full all-gather path")
    parser.add_argument("--zero-only", action="store_true", help="only the zero-redundancy path")
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--engine", action="store_true", help="also push every bucket into a vLLM engine")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
