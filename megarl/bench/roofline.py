"""`megarl bench roofline`: how far each stage of megarl's e2e step is from what the machine allows.

Per size (the e2e sizes, `megarl/bench/e2e.py`), megarl runs its e2e GRPO step (same config, 2 processes
× 1 thread) for `--warmup` + the measured steps; then the machine's rates are measured in the same run
(`peaks.py`: fp32 GEMM FLOP/s at each of the step's GEMM shapes, torch or OpenBLAS whichever is faster,
2 processes × 1 thread at once; memory bandwidth of a 256 MiB copy). Each stage's work is counted from
the model's config and each step's real token counts (`flops.py`: sequences, mean prompt and response
lengths, the longest response). A phase's floor is max(its GEMM FLOPs at the measured rate of their
shape + attention FLOPs at the best rate, its bytes / bandwidth); a stage's floor is the sum of its
phases'. The floor leaves out elementwise work (norms, SwiGLU, rotary, softmax, the loss), padding (tiny
and 3m update right-padded micro-batches: the floor counts real tokens only) and Python overhead: what
time / floor measures. `other` (reward, advantages, the driver) has no floor.

MFU = the stage's FLOPs / its seconds / the machine's peak: on CPU the best measured GEMM rate, on CUDA
the card's nominal dense bf16 peak. Writes `<out>/roofline.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from megarl.bench.e2e import CONFIG, SIZES, Size, megarl_overrides, megarl_steps, prepare
from megarl.bench.flops import STAGE_PHASES, Decoder, Phase, Sequences
from megarl.bench.measure import write_merged
from megarl.bench.peaks import measure_peaks

RANKS = 2  # the e2e's megarl side: 2 processes, DP 2, one engine each
STAGES = ("generation", "log_probs", "update", "transition", "other")


def step_sequences(record: dict) -> Sequences:
    """A step's sequences from its metrics.jsonl record (all tokens = throughput × seconds)."""
    count = int(record["batch/sequences"])
    tokens = record["throughput/tokens_per_s"] * record["step_seconds"]
    response = record["response_length/mean"]
    return Sequences(
        count=count,
        prompt=tokens / count - response,
        response=response,
        response_max=int(record["response_length/max"]),
        ranks=RANKS,
    )


def gemm_rate(peaks: dict, shape: tuple[int, int, int]) -> float:
    """The measured FLOP/s of `shape`, or of the measured shape nearest to it (log distance): the rates
    are measured at the median step's shapes, and another step's row counts differ by a few tokens."""

    def distance(key: str) -> float:
        return sum(abs(math.log(int(d) / s)) for d, s in zip(key.split("x"), shape))

    return peaks["gemm"][min(peaks["gemm"], key=distance)]["flops_per_s"]


def phase_floor(phase: Phase, peaks: dict) -> dict:
    """Seconds the phase needs at the measured rates: compute, memory, and the larger (its floor)."""
    compute = sum(f / gemm_rate(peaks, shape) for shape, f in phase.gemm_flops.items())
    compute += phase.other_flops / peaks["peak_flops_per_s"]
    memory = phase.bytes / peaks["bandwidth_bytes_per_s"]
    return {"compute_s": compute, "memory_s": memory, "floor_s": max(compute, memory)}


def stage_rows(model: Decoder, seqs: Sequences, split: dict, peaks: dict) -> dict:
    """Per stage: seconds, FLOPs, bytes, floor (and which bound), time / floor, MFU."""
    peak = peaks.get("nominal_flops_per_s") or peaks["peak_flops_per_s"]
    rows = {}
    for stage in STAGES:
        seconds = split[stage]
        if seconds <= 0:  # not run in this step (old log-probs fused into the update, no reference)
            continue
        if stage not in STAGE_PHASES:
            rows[stage] = {"seconds": seconds}
            continue
        phases = STAGE_PHASES[stage](model, seqs)
        floors = {name: phase_floor(p, peaks) for name, p in phases.items()}
        floor = sum(f["floor_s"] for f in floors.values())
        flops = sum(p.flops for p in phases.values())
        compute_bound = sum(f["floor_s"] for f in floors.values() if f["compute_s"] >= f["memory_s"])
        rows[stage] = {
            "seconds": seconds,
            "flops": flops,
            "bytes": sum(p.bytes for p in phases.values()),
            "floor_s": floor,
            "phases": floors,
            "bound": "compute" if compute_bound >= floor / 2 else "memory",
            "time_over_floor": seconds / floor,
            "mfu": flops / seconds / peak,
        }
    return rows


def gemm_shapes(model: Decoder, seqs: Sequences) -> list[tuple[int, int, int]]:
    shapes = {s for build in STAGE_PHASES.values() for p in build(model, seqs).values() for s in p.gemm_flops}
    return sorted(shapes)


def median_rows(steps: list[dict]) -> dict:
    """Each stage's median over the measured steps (seconds, floor, time / floor, MFU)."""
    out = {}
    for stage in STAGES:
        present = [s[stage] for s in steps if stage in s]
        if present:
            out[stage] = {
                k: statistics.median(r[k] for r in present)
                for k in present[0]
                if isinstance(present[0][k], float | int)
            }
            out[stage]["bound"] = present[0].get("bound")
    return out


def train(size: Size, model_dir: Path, data: Path, root: Path, steps: int) -> Path:
    """megarl's e2e run of `size` (`e2e.megarl_overrides`); its metrics.jsonl. Not through
    `measure.run_measured`: its PSS sampler reads smaps_rollup of each ~6 GB 25m rank every 0.5 s
    (~0.07 s of kernel time a read, ~14% of a core), time the stages would lose on 2 cores."""
    out = root / "roofline" / size.name / "megarl"
    shutil.rmtree(out, ignore_errors=True)  # else trainer.resume=auto would continue the last run
    cmd = [
        sys.executable,
        "-m",
        "megarl.cli",
        "train",
        str(CONFIG),
        *megarl_overrides(size, model_dir, data, out, steps),
    ]
    log = out.parent / "megarl.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"bench roofline: megarl train exit {code}; log {log}:\n{log.read_text()[-4000:]}")
    return out / "metrics.jsonl"


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoConfig

    from megarl.observe.machine import cpu_model
    from megarl.observe.run_files import read_metrics

    root = Path(args.out)
    device = "cuda" if args.device == "cuda" else "cpu"
    result = {"cores": os.cpu_count(), "cpu": cpu_model(), "warmup": args.warmup, "sizes": {}}
    for name in args.sizes:
        size = SIZES[name]
        model_dir, data, params = prepare(size, root)
        model = Decoder.from_hf(AutoConfig.from_pretrained(model_dir))
        steps = args.steps or size.steps
        print(
            f"bench roofline {name}: {params / 1e6:.2f}M parameters, megarl e2e, {steps} measured steps",
            flush=True,
        )
        metrics = train(size, model_dir, data, root, args.warmup + steps)
        splits = megarl_steps(metrics, args.warmup)
        records = [r for r in read_metrics(metrics) if r["step"] > args.warmup]
        seqs = [step_sequences(r) for r in records]
        median = sorted(seqs, key=lambda q: q.count * q.length)[len(seqs) // 2]
        print(f"  peaks ({device}) …", flush=True)
        peaks = measure_peaks(gemm_shapes(model, median), device, RANKS)
        per_step = [stage_rows(model, s, split, peaks) for s, split in zip(seqs, splits)]
        result["sizes"][name] = {
            "params": params,
            "model": model.__dict__,
            "sequences": median.__dict__,
            "peaks": peaks,
            "steps": per_step,
            "median": median_rows(per_step),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        merged = write_merged(root / "roofline.json", "sizes", result, list(SIZES), table)
        plot(merged, root / "roofline.png")
    return result


def table(result: dict) -> str:
    lines = [
        f"# megarl bench roofline — megarl's e2e GRPO step vs the machine's measured rates, {result['cores']} "
        f"cores ({result['cpu']}), median of the measured steps",
        "",
        "| size | stage | seconds | GFLOP | GB moved | floor s | bound | time / floor | MFU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in result["sizes"].items():
        q = e["sequences"]
        label = f"{name} ({e['params'] / 1e6:.2f}M, {q['count']} seqs × {q['prompt']:.1f}+{q['response']:.1f} tok)"
        for stage, r in e["median"].items():
            if "floor_s" not in r:
                lines.append(f"| {label} | {stage} | {r['seconds']:.3f} | | | | | | |")
                continue
            lines.append(
                f"| {label} | {stage} | {r['seconds']:.3f} | {r['flops'] / 1e9:.2f} | {r['bytes'] / 1e9:.3f} "
                f"| {r['floor_s']:.3f} | {r['bound']} | **{r['time_over_floor']:.2f}×** | {r['mfu']:.1%} |"
            )
    lines += ["", "| size | peak GEMM GF/s (shape, by) | bandwidth GB/s (copy r+w / read) |", "|---|---|---|"]
    for name, e in result["sizes"].items():
        p = e["peaks"]
        shape, best = max(p["gemm"].items(), key=lambda kv: kv[1]["flops_per_s"])
        lines.append(
            f"| {name} | {p['peak_flops_per_s'] / 1e9:.0f} ({shape}, {best['by']}) "
            f"| {p['bandwidth_bytes_per_s'] / 1e9:.1f} ({p['copy'] / 1e9:.1f} / {p['read'] / 1e9:.1f}) |"
        )
    below = [
        f"{name} {stage}"
        for name, e in result["sizes"].items()
        for stage, r in e["median"].items()
        if r.get("time_over_floor", 1.0) < 1.0
    ]
    if below:  # a stage faster than its floor: the rates were measured while the machine was busier
        lines += [
            "",
            f"Below the floor ({', '.join(below)}): the rates were measured low (a shared machine?).",
        ]
    lines += [
        "",
        "Rates measured by 2 processes × 1 thread at once (megarl's ranks), fp32, after the size's e2e run. "
        "Floor: per phase max(GEMM FLOPs at their shape's rate + attention at the best rate, bytes / "
        "bandwidth), summed over the stage's phases (generation: prefill, decode; update: forward+backward, "
        "gradient all-reduce + Adam; transition: the weight copy). Not in the floor: elementwise ops, padding, "
        "Python; `other` has none. MFU: FLOPs / seconds / the best GEMM rate (GPU: nominal bf16 peak).",
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(result["sizes"].items())
    fig, panels = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 4), squeeze=False)
    for panel, (name, e) in zip(panels[0], sizes):
        stages = [s for s, r in e["median"].items() if "floor_s" in r]
        xs = range(len(stages))
        panel.bar([x - 0.2 for x in xs], [e["median"][s]["seconds"] for s in stages], 0.4, label="measured")
        panel.bar([x + 0.2 for x in xs], [e["median"][s]["floor_s"] for s in stages], 0.4, label="floor")
        for x, s in zip(xs, stages):
            panel.annotate(
                f"{e['median'][s]['time_over_floor']:.1f}×", (x, e["median"][s]["seconds"]), ha="center"
            )
        panel.set_xticks(list(xs), stages)
        panel.set_title(f"{name} ({e['params'] / 1e6:.1f}M)")
        panel.set_ylabel("seconds per step")
        panel.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "3m", "25m"], choices=list(SIZES))
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--steps", type=int, default=None, help="measured steps (default: the size's e2e steps)"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where the rates are measured (cuda: bf16 GEMMs, MFU against the card's nominal peak)",
    )
