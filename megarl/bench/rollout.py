"""`megarl bench rollout`: vLLM inside the trainer, after a weight sync, vs a standalone vLLM engine.

Trainer side: `--nproc` ranks (torchrun, 1 thread each), each an ActorWorker built from the e2e suite's
trainer config for the size (configs/quickstart_grpo.yaml + its overrides: TP1, rollout.tp 1, so one
engine replica per rank). One policy update at lr 1e-3 first, so the engines run synced weights that
differ from the checkpoint's; then `--warmup` + `--repeats` calls of `actor.generate` (the
3D-HybridEngine: offload, reshard into the engine, generate, reload) on the same random prompts, each
replica its share. Timed: the engine's generate inside it, and the transition around it.

Standalone side: after the trainer's ranks have exited, one plain vLLM process per replica
(`megarl/bench/peers/vllm_standalone.py`: the same engine arguments, the in-process engine core, the
same threads), all at once, loading the trainer's synced weights from an HF export and replaying the
same calls: the same prompts and per-request sampling seeds. The same weights and seeds sample the
same tokens; the table says whether every token matched (equal work, and a check of the sync).

tokens/s of a call = completion tokens of all replicas / the slowest replica's generate seconds (the
replicas run concurrently, and a step waits for the last). Writes `<out>/rollout.json` and `rollout.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from megarl.bench.e2e import CONFIG, SIZES, megarl_overrides, prepare
from megarl.bench.measure import spread, spread_text, write_merged

PEER_SCRIPT = Path(__file__).resolve().parent / "peers" / "vllm_standalone.py"
PROMPT_TOKENS = 24
SYNC_LR = 1e-3


def _prompts(vocab: int, n: int):
    import torch

    from megarl.protocol import Batch

    ids = torch.randint(5, vocab, (n, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    return Batch(tensors={"prompts": ids, "attention_mask": torch.ones_like(ids)})


def bench_rank(spec: dict) -> dict:
    """The trainer side on every rank; rank 0 returns every replica's calls."""
    import torch
    import torch.distributed as dist

    from megarl.bench.train import _batch
    from megarl.config.load import load_config
    from megarl.config.roles import role_spec
    from megarl.distributed.generation_plan import GenerationPlan
    from megarl.rollout.vllm import request_seeds, sampling_params
    from megarl.workers.actor import ActorWorker

    size, rank, world = SIZES[spec["size"]], dist.get_rank(), dist.get_world_size()
    overrides = megarl_overrides(size, Path(spec["model"]), Path(spec["data"]), Path(spec["out"]), 1)
    if spec.get("eager"):  # --eager: both sides' engines without torch.compile (start-up ≈ 20-50 s less)
        overrides = [o for o in overrides if not o.startswith("rollout.enforce_eager=")]
        overrides.append("rollout.enforce_eager=true")
    cfg = load_config(CONFIG, [*overrides, f"actor.optimizer.lr={SYNC_LR}"])
    actor = ActorWorker(role_spec(cfg, "actor"))
    vocab = actor.arch.vocab_size
    actor.update(_batch(vocab, size.prompts * size.group // world, PROMPT_TOKENS, size.new_tokens, seed=rank))
    plan = GenerationPlan.for_layout(actor.layout, cfg.rollout.tp, actor.arch.num_kv_heads)
    replica = next(i for i, group in enumerate(plan.gen_tp_groups) if rank in group)
    share = _prompts(vocab, size.prompts).chunk(len(plan.gen_tp_groups))[replica]
    max_tokens = cfg.rollout.max_tokens or cfg.data.max_response_length
    log_probs = bool(cfg.rollout.calculate_log_probs)  # what the trainer's generate asks the engine for
    calls = []
    for _ in range(spec["warmup"] + spec["repeats"]):
        out = actor.generate(share)
        rollout = actor.hybrid.rollout
        seconds = out.meta["hybrid_engine"]["seconds"]
        seeds = request_seeds(rollout.seed, replica, rollout.sampling_step - 1, len(share))
        mask = out["response_mask"].bool()
        calls.append(
            {
                "prompts": share["prompts"].tolist(),
                "params": [sampling_params(cfg.rollout, max_tokens, s, log_probs) for s in seeds],
                "seconds": seconds["generate"],
                "transition_seconds": seconds["offload"] + seconds["sync"] + seconds["reload"],
                "token_ids": [row[m].tolist() for row, m in zip(out["responses"], mask)],
            }
        )
    actor.export_hf(spec["weights"])
    engine = {**actor.hybrid.rollout.engine_kwargs, "model": spec["weights"]}
    mine = {"rank": rank, "replica": replica, "calls": calls, "threads": torch.get_num_threads()}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    actor.shutdown()
    first_ranks = {min(group) for group in plan.gen_tp_groups}  # one record per replica
    return {"engine": engine, "replicas": [r for r in everyone if r["rank"] in first_ranks]}


def _standalone(trainer: dict, root: Path) -> list[dict]:
    """One standalone engine process per replica, all at once; each replica's result."""
    procs = []
    for r in trainer["replicas"]:
        spec, result = (
            root / f"standalone-{r['replica']}.json",
            root / f"standalone-{r['replica']}-result.json",
        )
        calls = [{"prompts": c["prompts"], "params": c["params"]} for c in r["calls"]]
        spec.write_text(json.dumps({"engine": trainer["engine"], "calls": calls}))
        env = {**os.environ, "OMP_NUM_THREADS": str(r["threads"])}
        log = open(root / f"standalone-{r['replica']}.log", "w")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, str(PEER_SCRIPT), str(spec), str(result)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log, result))
    results = []
    for proc, log, result in procs:
        proc.wait()
        log.close()
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"the standalone vLLM engine failed (exit {proc.returncode}); see {log.name}")
        results.append(json.loads(result.read_text()))
    return results


def compare(trainer: dict, standalone: list[dict], warmup: int) -> dict:
    """Per timed call: tokens/s of both sides (all replicas' tokens / the slowest replica) and matches."""
    replicas = trainer["replicas"]
    rows = {"trainer": [], "standalone": [], "transition_seconds": []}
    samples = mismatched = 0
    for call in range(warmup, len(replicas[0]["calls"])):
        ours = [r["calls"][call] for r in replicas]
        tokens = sum(len(t) for c in ours for t in c["token_ids"])
        rows["trainer"].append(tokens / max(c["seconds"] for c in ours))
        rows["standalone"].append(tokens / max(s["seconds"][call] for s in standalone))
        rows["transition_seconds"].append(max(c["transition_seconds"] for c in ours))
        for c, s in zip(ours, standalone):
            samples += len(c["token_ids"])
            mismatched += sum(a != b for a, b in zip(c["token_ids"], s["token_ids"][call]))
    trainer_tps, standalone_tps = spread(rows["trainer"]), spread(rows["standalone"])
    return {
        "trainer_tokens_per_s": {**trainer_tps, "raw": rows["trainer"]},
        "standalone_tokens_per_s": {**standalone_tps, "raw": rows["standalone"]},
        "transition_seconds": spread(rows["transition_seconds"]),
        "ratio": trainer_tps["median"] / standalone_tps["median"],
        "samples": samples,
        "mismatched_samples": mismatched,
    }


def run(args: argparse.Namespace) -> dict:
    from megarl.distributed.rank_program import launch_rank_program

    root = Path(args.out)
    result = {"sizes": {}}
    for name in args.sizes:
        size = SIZES[name]
        model, data, params = prepare(size, root)
        work = root / "rollout" / name
        work.mkdir(parents=True, exist_ok=True)
        spec = {
            "size": name,
            "model": str(model),
            "data": str(data),
            "out": str(work / "run"),
            "weights": str(work / "synced_hf"),
            "warmup": args.warmup,
            "repeats": args.repeats,
            "eager": args.eager,
        }
        print(f"bench rollout {name}: {params / 1e6:.2f}M, {size.prompts}×{size.group}×{size.new_tokens}")
        launch = launch_rank_program("megarl.bench.rollout:bench_rank", spec, nproc=args.nproc)
        if not launch.results:
            raise RuntimeError(f"rollout benchmark (trainer side) failed:\n{launch.failure_summary()}")
        trainer = launch.results[0]
        numbers = compare(trainer, _standalone(trainer, work), args.warmup)
        result["sizes"][name] = {
            "params": params,
            "prompts": size.prompts,
            "n": size.group,
            "max_tokens": size.new_tokens,
            "replicas": len(trainer["replicas"]),
            "threads": trainer["replicas"][0]["threads"],
            **numbers,
        }
        print(
            f"  in trainer {numbers['trainer_tokens_per_s']['median']:.0f} tok/s, standalone "
            f"{numbers['standalone_tokens_per_s']['median']:.0f} tok/s: {numbers['ratio']:.2f}×"
        )
    return write_merged(root / "rollout.json", "sizes", result, list(SIZES), table)


def table(result: dict) -> str:
    lines = [
        "# megarl bench rollout — vLLM in the trainer (after a weight sync) vs a standalone vLLM engine",
        "",
        "Same engine arguments, prompts, sampling seeds and weights; completion tokens/s, median (min–max).",
        "",
        "| size | replicas × threads | prompts × n × max tokens | in trainer tok/s | standalone tok/s "
        "| in trainer / standalone | weight sync + offload s | samples identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["sizes"].items():
        t, s, x = r["trainer_tokens_per_s"], r["standalone_tokens_per_s"], r["transition_seconds"]
        same = r["samples"] - r["mismatched_samples"]
        lines.append(
            f"| {name} ({r['params'] / 1e6:.2f}M) | {r['replicas']} × {r['threads']} "
            f"| {r['prompts']} × {r['n']} × {r['max_tokens']} "
            f"| {spread_text(t, '{:.0f}')} | {spread_text(s, '{:.0f}')} "
            f"| **{r['ratio']:.2f}×** | {x['median']:.3f} | {same}/{r['samples']} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "3m", "25m"], choices=list(SIZES))
    parser.add_argument("--nproc", type=int, default=2, help="trainer ranks = engine replicas")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls (tiny calls take ~0.1 s: noisy)")
    parser.add_argument(
        "--eager",
        action="store_true",
        help="engines without torch.compile (rollout.enforce_eager=true; default: the e2e config's false)",
    )
