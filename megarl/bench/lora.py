"""`megarl bench lora`: full fine-tuning vs LoRA on the same model, batch and layout, in the same
processes, as ratios LoRA/full.

Per size (`--sizes`, the e2e bench's random Llamas; 3m by default, about a minute on 2 CPU cores), one
launch of TP × PP ranks (`--tp`, `--pp`; DP 1) runs both sides:

- Update: an ActorWorker `update` on the train bench's random batch (`--sequences` × (`--prompt-len` +
  `--response-len`), PPO clip loss at ratio 1); after each side's `--warmup` updates (and the reference
  step below), `--repeats` timed updates per side with the sides taking turns (full, LoRA, LoRA, full, …:
  a drift of the machine's speed weighs on both alike); the median (min–max) seconds, tokens/s at the
  median and at the fastest update (on shared cores the least disturbed one). LoRA:
  `actor.lora` at `--rank` / `--alpha` on `--targets` (all seven projections by default), base frozen.
- State: trainable parameters; per rank the weights, the gradient buffers and the optimizer's own state
  (Adam moments and any fp32 main copy; `megarl.hybrid.offload.training_state_bytes`), and the weights
  of the reference copy full training keeps for its KL term (LoRA: none).
- Peak memory, per process (megarl.bench.memory: on CPU the resident set's high-water mark, reset after
  the build, minus the RSS before the side; on GPU the peak allocation), of the actor alone over its
  warm-up updates, then of a step with the reference held: full = the actor plus a colocated
  ReferenceWorker copy, LoRA = the same actor with its adapters off (`ref_log_prob`, no copy); each a
  reference forward and an update. LoRA's side is built first, so it pays the process's first-use
  allocations: the LoRA/full memory ratios are, if anything, high. On CPU the peaks come from a second
  launch (both sides, no timing, no engine) in which glibc hands every freed tensor back to the OS
  (`exact_host_memory`): in the timed launch the heap keeps freed memory for reuse, as training does,
  and its fragments count to RSS unevenly (at 3m they put LoRA's peak 200 MiB above full's, with the
  same saved activations); those peaks stay in the JSON (`memory_timed_run`). `--no-memory-run` skips it.
- Sync into a colocated vLLM engine (one engine per rank, started once, LoRA enabled at `--rank`,
  reused for all three cases), through `HybridEngine.sync_weights`, each case once (its first sync,
  in the JSON) and then `--repeats` times: **full** (the base Resharder: every weight, what full training
  syncs each step), **merged** (LoraWeightSync "merged" after its first sync: W + (α/r)·B·A of the
  targeted linears only) and **adapter** (LoraWeightSync "adapter" after its first sync, which also
  pushed the base: the adapter tensors only, `VLLMRollout.load_adapter`). Per engine rank: bytes handed
  to the engine (full-shaped HF / PEFT tensors; at generation TP > 1 each rank's engine reads its
  region of them), bytes received over the wire against the plan's floor, and the median seconds.
  The full and merged loads go into the same LoRA-enabled engine as the adapter, before any adapter
  is loaded (the adapter case runs last: a loaded adapter makes every later weight load reinstall it).

Writes `<out>/lora.json` and `lora.md` (sizes this run did not measure keep their earlier numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path

from megarl.bench.e2e import SIZES, launch_order, prepare
from megarl.bench.measure import spread, spread_text, write_merged
from megarl.bench.memory import PeakMemory, exact_host_memory, exact_host_memory_launch
from megarl.bench.train import _batch, actor_config

SYNC_CASES = ("full", "merged", "adapter")
SYNC_WHAT = {
    "full": "every weight (base Resharder)",
    "merged": "W + (α/r)·B·A of the targeted linears",
    "adapter": "the adapter tensors (load_adapter)",
}


def _config(args: argparse.Namespace, lora: bool):
    cfg = actor_config(args, "megatron")
    cfg.actor.parallel.tp, cfg.actor.parallel.pp = args.tp, args.pp
    cfg.ref.micro_batch_size = cfg.actor.micro_batch_size
    cfg.rollout.tp, cfg.rollout.enforce_eager = args.gen_tp, True
    cfg.rollout.kv_cache_memory_bytes = 16 << 20  # the engine only takes weights here, never generates
    cfg.data.max_prompt_length, cfg.data.max_response_length = args.prompt_len, args.response_len
    if lora:
        lora_cfg = cfg.actor.lora
        lora_cfg.rank, lora_cfg.alpha, lora_cfg.target_modules = args.rank, args.alpha, list(args.targets)
    return cfg


def _side(args: argparse.Namespace, batch, lora: bool) -> tuple:
    """(the actor, its numbers): built and warmed up (`--warmup` updates), its peak memory alone and over
    a step with a reference held (full: a ReferenceWorker copy beside it; LoRA: the actor with its
    adapters off), what it holds (weights, gradient buffers, optimizer state; the reference's weights)."""
    import torch

    from megarl.config.roles import role_spec
    from megarl.hybrid.offload import training_state_bytes
    from megarl.workers.actor import ActorWorker
    from megarl.workers.reference import ReferenceWorker

    cfg = _config(args, lora)
    memory = PeakMemory()
    memory.start()
    actor = ActorWorker(role_spec(cfg, "actor"))
    memory.built()
    for _ in range(args.warmup):
        actor.update(batch)
    memory.stop()
    alone = memory.result
    reference = actor if lora else ReferenceWorker(role_spec(cfg, "ref"))
    memory.built()  # the peak from here: a reference forward and an update with the reference held
    reference.ref_log_prob(batch)
    actor.update(batch)
    memory.stop()
    params = [p for chunk in actor.chunks for p in chunk.parameters()]
    return actor, {
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
        "weights_bytes": _bytes(params),
        "reference_weights_bytes": 0 if lora else _bytes(p for c in reference.chunks for p in c.parameters()),
        "state_bytes": training_state_bytes(actor.optimizer),
        "memory": alone,
        "memory_with_reference": memory.result,
        "threads": torch.get_num_threads(),
    }


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _alternating_updates(actors: dict, batch, repeats: int) -> dict[str, list[float]]:
    """Seconds of `repeats` updates per actor, the actors taking turns (A B, B A, …): a drift of the
    machine's speed (other processes on the cores) weighs on both alike."""
    from megarl.distributed.platform import platform

    seconds: dict[str, list[float]] = {name: [] for name in actors}
    for name in launch_order(list(actors), repeats):
        platform().synchronize()
        start = time.perf_counter()
        actors[name].update(batch)
        platform().synchronize()
        seconds[name].append(time.perf_counter() - start)
    return seconds


def _sync(hybrid) -> dict:
    """One `HybridEngine.sync_weights` of whatever source the engine holds: this rank's numbers."""
    start = time.perf_counter()
    stats = hybrid.sync_weights()
    seconds = time.perf_counter() - start
    hybrid.rollout.sleep()  # as after each generation (a no-op on CPU)
    return {
        "engine_bytes": stats.bucket_bytes + stats.adapter_bytes,
        "received_bytes": stats.received_bytes,
        "floor_bytes": stats.floor_bytes,
        "tensors": stats.tensors,
        "seconds": seconds,
        "phase_seconds": stats.seconds,
    }


def _sync_case(hybrid, source, repeats: int) -> dict:
    """The first sync of `source` (base included where the case pushes it once), then `repeats` timed."""
    hybrid.source = source
    first = _sync(hybrid)
    runs = [_sync(hybrid) for _ in range(repeats)]
    return {**runs[-1], "seconds": spread([r["seconds"] for r in runs]), "first": first}


def _sync_cases(full_actor, lora_actor, rollout_cfg, repeats: int) -> dict:
    """The three cases into one engine per rank (LoRA enabled; started once): full, merged, adapter."""
    from megarl.hybrid.engine import HybridEngine
    from megarl.hybrid.lora_sync import LoraWeightSync

    tp_groups, full = full_actor.generation_source(rollout_cfg)
    _, lora = lora_actor.generation_source(rollout_cfg)

    def mode(name: str) -> LoraWeightSync:
        return LoraWeightSync(
            lora.chunks, lora.base, lora.adapters, name, lora.peft_config, False, lora.num_kv_heads
        )

    rollout = replace(lora_actor.rollout_spec, lora=lora_actor.spec.lora)  # the engine serves adapters
    hybrid = HybridEngine(full, tp_groups, rollout, offload=lambda: [], reload=lambda: [])
    try:
        sources = {"full": full, "merged": mode("merged"), "adapter": mode("adapter")}
        return {case: _sync_case(hybrid, sources[case], repeats) for case in SYNC_CASES}
    finally:
        hybrid.close()


def bench_rank(spec: dict) -> dict:
    """The rank program: both sides in these processes, then the three syncs; every rank's numbers."""
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig

    args = argparse.Namespace(**spec)
    if args.memory_run:  # before anything is allocated: the heap holds nothing from the default mode
        exact_host_memory()
    torch.set_num_threads(args.threads)
    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    batch = _batch(vocab, args.sequences, args.prompt_len, args.response_len)
    lora_actor, lora = _side(args, batch, lora=True)  # first: it pays the first-use allocations
    full_actor, full = _side(args, batch, lora=False)
    mine = {"full": full, "lora": lora}
    if not args.memory_run:
        seconds = _alternating_updates({"full": full_actor, "lora": lora_actor}, batch, args.repeats)
        full["seconds"], lora["seconds"] = seconds["full"], seconds["lora"]
        mine["sync"] = _sync_cases(full_actor, lora_actor, lora_actor.rollout_spec.rollout, args.repeats)
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "ranks": ranks,
    }


def summarize(ranks: list[dict], tokens: int) -> dict:
    """The ratios LoRA/full over the ranks: the slowest rank's update median, the largest rank's bytes."""
    out: dict = {}
    for side in ("full", "lora"):
        median = max(spread(r[side]["seconds"])["median"] for r in ranks)
        fastest = max(min(r[side]["seconds"]) for r in ranks)  # the least disturbed by other processes
        out[side] = {
            "update_seconds": median,
            "tokens_per_s": tokens / median,
            "fastest_tokens_per_s": tokens / fastest,
            "trainable_params": ranks[0][side]["trainable_params"],
            "params": ranks[0][side]["params"],
            "grads_bytes": max(r[side]["state_bytes"]["grads"] for r in ranks),
            "optimizer_bytes": max(r[side]["state_bytes"]["optimizer"] for r in ranks),
            "held_bytes": max(_held(r[side]) for r in ranks),
            "held_with_reference_bytes": max(
                _held(r[side]) + r[side]["reference_weights_bytes"] for r in ranks
            ),
            "peak_bytes": max(r[side]["memory"]["peak_bytes"] or 0 for r in ranks),
            "peak_with_reference_bytes": max(
                r[side]["memory_with_reference"]["peak_bytes"] or 0 for r in ranks
            ),
        }
    f, lo = out["full"], out["lora"]
    out["ratio"] = {key: lo[key] / f[key] if f[key] else None for key in f}
    return out


def _held(side: dict) -> int:
    """Bytes a side holds between steps: its weights, gradient buffers and optimizer state."""
    return side["weights_bytes"] + side["state_bytes"]["grads"] + side["state_bytes"]["optimizer"]


def _launch(spec: dict, nproc: int, memory_run: bool) -> dict:
    from megarl.distributed.rank_program import launch_rank_program

    with exact_host_memory_launch() if memory_run else contextlib.nullcontext():
        launch = launch_rank_program(
            "megarl.bench.lora:bench_rank", {**spec, "memory_run": memory_run}, nproc
        )
    if not launch.results:
        raise RuntimeError(f"lora benchmark failed:\n{launch.failure_summary()}")
    return launch.results[0]


def _use_exact_memory(ranks: list[dict], exact: list[dict]) -> None:
    """Each side's peaks from the memory launch; the timed launch's kept as `memory_timed_run`."""
    keys = ("memory", "memory_with_reference")
    for rank, measured in zip(ranks, exact):
        for side in ("full", "lora"):
            rank[side]["memory_timed_run"] = {k: rank[side][k] for k in keys}
            rank[side].update({k: measured[side][k] for k in keys})


def run(args: argparse.Namespace) -> dict:
    from megarl.distributed.platform import platform
    from megarl.observe.machine import cpu_model

    root = Path(args.out)
    nproc = args.tp * args.pp
    result: dict = {"sizes": {}}
    for name in args.sizes:
        model, _, params = prepare(SIZES[name], root)
        spec = {
            "model": str(model),
            **{k: getattr(args, k) for k in ("sequences", "prompt_len", "response_len", "warmup", "repeats")},
            **{k: getattr(args, k) for k in ("tp", "pp", "gen_tp", "rank", "alpha", "targets", "dtype")},
            "micro_batch": None,
            "backend": "megatron",
            "threads": args.threads or max(1, (os.cpu_count() or 1) // nproc),
        }
        print(
            f"bench lora {name}: {params / 1e6:.2f}M, LoRA r{args.rank} vs full, {nproc} rank(s)", flush=True
        )
        measured = _launch(spec, nproc, memory_run=False)
        if not platform().is_cuda and not args.no_memory_run:  # CPU: the peaks from a launch of their own
            _use_exact_memory(measured["ranks"], _launch(spec, nproc, memory_run=True)["ranks"])
        tokens = args.sequences * (args.prompt_len + args.response_len)
        result["sizes"][name] = {
            "params": params,
            "cpu": cpu_model(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **spec,
            "tokens": tokens,
            **measured,
            "summary": summarize(measured["ranks"], tokens),
        }
        result = write_merged(root / "lora.json", "sizes", result, list(SIZES), table)
    return result


def _mib(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:,.2f}"


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"**{x:.3f}**"


def _update_seconds(entry: dict, side: str) -> str:
    """The slowest rank's spread of `side`'s update seconds."""
    spreads = [spread(r[side]["seconds"]) for r in entry["ranks"]]
    return spread_text(max(spreads, key=lambda x: x["median"]), "{:.3f}")


def _memory_method(entry: dict) -> str:
    side = entry["ranks"][0]["full"]
    method = side["memory"]["method"]
    return (
        f"{method}, in a launch of its own, freed memory back to the OS"
        if "memory_timed_run" in side
        else method
    )


def table(result: dict) -> str:
    lines = ["# megarl bench lora — full fine-tuning vs LoRA, same model, batch, layout and processes"]
    for name, e in result["sizes"].items():
        s, r = e["summary"], e["summary"]["ratio"]
        f, lo = s["full"], s["lora"]
        lines += [
            "",
            f"## {name} ({e['params'] / 1e6:.2f}M), LoRA r{e['rank']} α{e['alpha']:g} on {', '.join(e['targets'])}; "
            f"TP {e['tp']} × PP {e['pp']}, generation TP {e['gen_tp']}; {e['device']}, {e.get('cpu', '?')}, "
            f"torch threads per rank: {e['threads']}, {e['dtype']}",
            "",
            f"Update: {e['sequences']}×({e['prompt_len']}+{e['response_len']}) = {e['tokens']} tokens, median of "
            f"{e['repeats']} per side, the sides taking turns, after {e['warmup'] + 1} (the slowest rank). Bytes: "
            f"the largest rank. Peak memory: per process, growth over the side's start ({_memory_method(e)}).",
            "",
            "| | full | LoRA | LoRA/full |",
            "|---|---|---|---|",
            f"| trainable parameters | {f['trainable_params']:,} | {lo['trainable_params']:,} | {_ratio(r['trainable_params'])} |",
            f"| update s, median (min–max) | {_update_seconds(e, 'full')} | {_update_seconds(e, 'lora')} "
            f"| {_ratio(r['update_seconds'])} |",
            f"| update tokens/s, median | {f['tokens_per_s']:,.0f} | {lo['tokens_per_s']:,.0f} | {_ratio(r['tokens_per_s'])} |",
            f"| update tokens/s, fastest update | {f['fastest_tokens_per_s']:,.0f} | {lo['fastest_tokens_per_s']:,.0f} "
            f"| {_ratio(r['fastest_tokens_per_s'])} |",
            f"| gradient buffers MiB | {_mib(f['grads_bytes'])} | {_mib(lo['grads_bytes'])} | {_ratio(r['grads_bytes'])} |",
            f"| optimizer state MiB | {_mib(f['optimizer_bytes'])} | {_mib(lo['optimizer_bytes'])} | {_ratio(r['optimizer_bytes'])} |",
            f"| weights + gradients + optimizer state MiB | {_mib(f['held_bytes'])} | {_mib(lo['held_bytes'])} "
            f"| {_ratio(r['held_bytes'])} |",
            f"| the same + the reference's weights MiB | {_mib(f['held_with_reference_bytes'])} "
            f"| {_mib(lo['held_with_reference_bytes'])} | {_ratio(r['held_with_reference_bytes'])} |",
            f"| peak memory MiB, actor | {_mib(f['peak_bytes'])} | {_mib(lo['peak_bytes'])} | {_ratio(r['peak_bytes'])} |",
            f"| peak memory MiB, with the reference (full: + a reference copy; LoRA: adapters off) "
            f"| {_mib(f['peak_with_reference_bytes'])} | {_mib(lo['peak_with_reference_bytes'])} "
            f"| {_ratio(r['peak_with_reference_bytes'])} |",
            "",
            f"Sync into the colocated vLLM engine per engine rank, after each case's first sync: median (min–max) "
            f"of {e['repeats']}; MiB handed to the engine, MiB received over the wire (the plan's floor).",
            "",
            "| rank | case | what moves | MiB to the engine | MiB received (floor) | seconds | bytes / full | seconds / full "
            "| first sync MiB, s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for rank, measured in enumerate(e["ranks"]):
            sync = measured["sync"]
            full = sync["full"]
            for case in SYNC_CASES:
                c = sync[case]
                lines.append(
                    f"| {rank} | {case} | {SYNC_WHAT[case]} | {_mib(c['engine_bytes'])} "
                    f"| {_mib(c['received_bytes'])} ({_mib(c['floor_bytes'])}) | {spread_text(c['seconds'], '{:.4f}')} "
                    f"| {_ratio(c['engine_bytes'] / full['engine_bytes'])} "
                    f"| {_ratio(c['seconds']['median'] / full['seconds']['median'])} "
                    f"| {_mib(c['first']['engine_bytes'])}, {c['first']['seconds']:.3f} |"
                )
    return "\n".join(lines) + "\n"


def _at_least_one(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"{text}: the actor-alone peak memory is taken over these updates; use >= 1"
        )
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench", help="writes lora.json and lora.md here")
    parser.add_argument("--sizes", nargs="+", default=["3m"], choices=list(SIZES))
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank r")
    parser.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (scaling alpha / r)")
    parser.add_argument(
        "--targets", nargs="+", default=["all-linear"], help="actor.lora.target_modules (default: all seven)"
    )
    parser.add_argument("--tp", type=int, default=1, help="training TP (ranks: TP × PP, DP 1)")
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--gen-tp", type=int, default=1, help="the engine's TP")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=96)
    parser.add_argument(
        "--warmup",
        type=_at_least_one,
        default=1,
        help="updates per side before its timed ones (>= 1: the actor's peak memory is taken over them)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed updates per side, and timed syncs per case"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per rank (default: cores / ranks)"
    )
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument(
        "--no-memory-run",
        action="store_true",
        help="CPU: skip the second launch that measures the peak memory exactly (the peaks are then the timed "
        "launch's, which count the heap's fragments)",
    )
