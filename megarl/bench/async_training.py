"""`megarl bench async`: the time dimension — colocated synchronous vs a separate engines' pool at
max_staleness 0, 1, 2 and 1 with partial rollouts — on a workload with a long tail of response lengths.

Every variant trains the same tiny Llama (random weights) on the same digits_reverse prompts with the same
GRPO settings for `--warmup` + `--steps` steps under Ray on the same 2 devices (CPU process slots):
colocated = the actor on both, its engines inside its processes (the 3D-HybridEngine); separate = the
actor on one, the engine on the other. The long tail: the random model samples nearly uniformly over
its vocabulary and every `--stop-every`-th token id ends a response (rollout.stop_token_ids), so response
lengths are geometric — most short, a few at `--max-tokens`: the slowest sample of a batch decides when
a synchronous step's generation ends, which is where async training pays.

Per variant the table gives the median (min–max) over the measured steps of the response tokens per second
(`response_length/mean` × sequences / step seconds), the step seconds, and the share of the step each
pool was busy (separate pools: the engines' generation seconds and the trainer's non-waiting seconds over
the step; colocated: the one pool is always busy, split into its generation and training shares), and
tokens/s over the colocated run's. Writes `<out>/async.json` and `<out>/async.md`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from megarl.bench.measure import run_measured, spread, spread_text, write_merged

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart_grpo.yaml"
SEED = 0
SEPARATE = ("actor.n_devices=1", "rollout.placement=separate", "rollout.n_devices=1")
VARIANTS: dict[str, tuple[str, ...]] = {
    "colocated": (),
    "separate_sync": SEPARATE,
    "staleness_1": (*SEPARATE, "async_training.max_staleness=1"),
    "staleness_2": (*SEPARATE, "async_training.max_staleness=2"),
    "staleness_1_partial": (
        *SEPARATE,
        "async_training.max_staleness=1",
        "async_training.partial_rollout=true",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--warmup", type=int, default=2, help="steps not measured (start-up, first sync)")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per variant")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=96, help="the response budget")
    parser.add_argument("--stop-every", type=int, default=24, help="every N-th token id ends a response")


def prepare(root: Path) -> tuple[Path, Path, int]:
    """(model dir, train parquet, vocabulary size), built once under `root`."""
    import json

    from megarl.data.tasks import make_task
    from megarl.models.tiny import build_tiny_hf

    model = root / "models" / "tiny"
    if not (model / "config.json").exists():
        build_tiny_hf(model, family="llama", seed=SEED)
    data = root / "data" / "train.parquet"
    if not data.exists():
        make_task("digits_reverse", data.parent, seed=SEED)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    return model, data, vocab


def overrides(args: argparse.Namespace, model: Path, data: Path, vocab: int, out: Path) -> list[str]:
    sequences = args.prompts * args.group
    stops = list(range(args.stop_every - 1, vocab, args.stop_every))
    return [
        f"model.path={model}",
        f"data.train_files=[{data}]",
        "data.val_files=[]",
        f"data.train_batch_size={args.prompts}",
        f"data.max_response_length={args.max_tokens}",
        f"data.seed={SEED}",
        f"rollout.n={args.group}",
        f"rollout.max_num_seqs={sequences}",
        f"rollout.stop_token_ids=[{','.join(map(str, stops))}]",
        f"actor.micro_batch_size={sequences // 2}",  # divides a rank's share at DP1 (separate) and DP2
        f"ref.micro_batch_size={sequences // 2}",
        f"algorithm.ppo_mini_batch_size={args.prompts}",
        "algorithm.rollout_correction.rollout_is=token",  # the decoupled objective, in every variant
        "trainer.n_devices_per_node=2",
        "trainer.launcher=ray",
        f"trainer.total_steps={args.warmup + args.steps}",
        "trainer.eval_every=0",
        "trainer.val_before_train=false",
        "trainer.save_every=-1",
        f"trainer.output_dir={out}",
        f"trainer.seed={SEED}",
        "logging.backends=[console,jsonl]",
        "logging.report=false",
    ]


def measured_steps(metrics: Path, warmup: int) -> list[dict]:
    from megarl.observe.run_files import read_metrics

    steps = []
    for r in read_metrics(metrics):
        if r["step"] <= warmup:
            continue
        seconds = r["step_seconds"]
        if "async/engine_busy_share" in r:
            engine, trainer = r["async/engine_busy_share"], r["async/trainer_busy_share"]
        else:  # colocated: one pool, generating then training
            engine = r.get("generate/engine_seconds", r["timing/generate"]) / seconds
            trainer = 1.0 - r["timing/generate"] / seconds
        steps.append(
            {
                "step_seconds": seconds,
                "tokens_per_s": r["response_length/mean"] * r["batch/sequences"] / seconds,
                "engine_busy": engine,
                "trainer_busy": trainer,
                "staleness_max": r.get("async/staleness_max", 0.0),
                "response_length_max": r["response_length/max"],
                "response_length_mean": r["response_length/mean"],
            }
        )
    return steps


def run(args: argparse.Namespace) -> dict:
    from megarl.observe.machine import cpu_model

    root = Path(args.out)
    model, data, vocab = prepare(root)
    result: dict = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "workload": {
            "prompts": args.prompts,
            "group": args.group,
            "max_tokens": args.max_tokens,
            "stop_every": args.stop_every,
            "steps": args.steps,
            "warmup": args.warmup,
        },
        "variants": {},
    }
    for name in args.variants:
        out = root / "async" / name
        shutil.rmtree(out, ignore_errors=True)  # else trainer.resume=auto would continue the last run
        cmd = [sys.executable, "-m", "megarl.cli", "train", str(CONFIG)]
        cmd += overrides(args, model, data, vocab, out) + list(VARIANTS[name])
        print(f"bench async {name} …", flush=True)
        measured = run_measured(cmd, out.parent / f"{name}.log")
        steps = measured_steps(out / "metrics.jsonl", args.warmup)
        summary = {key: spread([s[key] for s in steps]) for key in steps[0]}
        result["variants"][name] = {"wall_seconds": measured.seconds, "steps": steps, "summary": summary}
        print(
            f"  {name}: {summary['tokens_per_s']['median']:.0f} tok/s, "
            f"{summary['step_seconds']['median']:.2f} s/step",
            flush=True,
        )
    base = result["variants"].get("colocated")
    if base is not None:
        for entry in result["variants"].values():
            entry["ratio_tokens_per_s"] = (
                entry["summary"]["tokens_per_s"]["median"] / base["summary"]["tokens_per_s"]["median"]
            )
    write_merged(root / "async.json", "variants", result, list(VARIANTS), table)
    return result


def table(result: dict) -> str:
    w = result.get("workload", {})
    lines = [
        f"# megarl bench async — {result.get('cpu', '?')}, {result.get('cores', '?')} cores",
        "",
        f"{w.get('prompts')} prompts × {w.get('group')} samples a step, responses ≤ {w.get('max_tokens')} tokens "
        f"(every {w.get('stop_every')}-th token id stops: a long tail), {w.get('steps')} measured steps after "
        f"{w.get('warmup')}; median (min–max). 2 devices: colocated = both train and generate; separate = "
        "one trains, one generates.",
        "",
        "| variant | tokens/s | × colocated | step s | trainer busy | engines busy | staleness max | longest response |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in result.get("variants", {}).items():
        s = entry["summary"]
        ratio = entry.get("ratio_tokens_per_s")
        lines.append(
            f"| {name} | {spread_text(s['tokens_per_s'], '{:.0f}')} | "
            f"{'' if ratio is None else f'{ratio:.2f}'} | {spread_text(s['step_seconds'])} | "
            f"{spread_text(s['trainer_busy'])} | {spread_text(s['engine_busy'])} | "
            f"{s['staleness_max']['max']:.0f} | {s['response_length_max']['max']:.0f} |"
        )
    return "\n".join(lines) + "\n"
