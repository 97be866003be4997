"""`megarl bench scaling`: megarl's GRPO step time and completion tokens/s as the work grows, one axis
at a time from a base point (the tiny Llama, 8 prompts × 4 samples × 32 new tokens):

- model size: tiny (0.85M) → 3M → 25M parameters (`megarl bench e2e`'s models);
- prompts per step: 8 → 16 → 32 → 64;
- response length (max new tokens): 32 → 64 → 128 → 256.

Each point is a real `megarl train` run (warm-up steps, then the median of the measured ones). Per
axis the fitted exponent b of step_seconds ∝ x^b (least squares in log-log) says how cost grows: b ≈ 1
is linear in the work, b ≪ 1 means fixed per-step overhead dominates. Writes `<out>/scaling.json`,
`scaling.md` and the log-log plot `scaling.png`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

from megarl.bench.e2e import SIZES, prepare, run_megarl, summarize_side
from megarl.bench.measure import write_merged

BASE = SIZES["tiny"]
AXES = {
    "model_params": ["tiny", "3m", "25m"],
    "prompts": [8, 16, 32, 64],
    "new_tokens": [32, 64, 128, 256],
}


def points(axis: str) -> list:
    """(label, Size) of each point on `axis`: the base with one thing changed."""
    if axis == "model_params":
        return [
            (
                name,
                replace(
                    SIZES[name], name=name, prompts=BASE.prompts, group=BASE.group, new_tokens=BASE.new_tokens
                ),
            )
            for name in AXES[axis]
        ]
    if axis == "prompts":
        return [(n, replace(BASE, prompts=n)) for n in AXES[axis]]
    return [(n, replace(BASE, new_tokens=n)) for n in AXES[axis]]


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def run(args: argparse.Namespace) -> dict:
    root = Path(args.out)
    result: dict = {"base": BASE.__dict__, "warmup": args.warmup, "steps": args.steps, "axes": {}}
    for axis in args.axes:
        rows = []
        for label, size in points(axis):
            model, data, params = prepare(size, root)  # its model is the tiny one off the model axis
            tag = replace(size, name=f"{axis}-{label}")
            print(f"bench scaling {axis}={label}: {size.prompts}×{size.group}×{size.new_tokens}", flush=True)
            summary = summarize_side(run_megarl(tag, model, data, root, args.warmup, args.steps, "scaling"))
            x = params if axis == "model_params" else label
            rows.append({"label": str(label), "x": x, **summary})
            print(
                f"  {summary['step_seconds']['median']:.2f} s/step, {summary['tokens_per_s']['median']:.0f} tok/s"
            )
        xs = [r["x"] for r in rows]
        result["axes"][axis] = {
            "points": rows,
            "exponent_step_seconds": fit_exponent(xs, [r["step_seconds"]["median"] for r in rows]),
            "exponent_tokens_per_s": fit_exponent(xs, [r["tokens_per_s"]["median"] for r in rows]),
        }
        _write(root, result)
    return result


def _write(root: Path, result: dict) -> None:
    """scaling.{json,md,png}; axes this run did not measure keep their earlier points."""
    merged = write_merged(root / "scaling.json", "axes", result, list(AXES), table)
    plot(merged, root / "scaling.png")


def table(result: dict) -> str:
    lines = [
        "# megarl bench scaling — GRPO step, median of "
        f"{result['steps']} steps; base {BASE.prompts}×{BASE.group}×{BASE.new_tokens} on the tiny Llama",
        "",
        "| axis | point | step s | completion tok/s | generation | log-probs | update | transition |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for axis, a in result["axes"].items():
        for r in a["points"]:
            x = f"{r['x'] / 1e6:.2f}M" if axis == "model_params" else r["label"]
            lines.append(
                f"| {axis} | {x} | {r['step_seconds']['median']:.2f} | {r['tokens_per_s']['median']:.0f} | "
                + " | ".join(
                    f"{r[k]['median']:.2f}" for k in ("generation", "log_probs", "update", "transition")
                )
                + " |"
            )
    lines += ["", "| axis | exponent of step s | exponent of tok/s |", "|---|---|---|"]
    for axis, a in result["axes"].items():
        lines.append(f"| {axis} | {a['exponent_step_seconds']:.2f} | {a['exponent_tokens_per_s']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = list(result["axes"].items())
    fig, panels = plt.subplots(1, len(axes), figsize=(5 * len(axes), 4), squeeze=False)
    for panel, (axis, a) in zip(panels[0], axes):
        xs = [r["x"] for r in a["points"]]
        for key, style in (("step_seconds", "o-"), ("generation", "s--"), ("update", "^--")):
            panel.loglog(xs, [r[key]["median"] for r in a["points"]], style, label=key)
        panel.set_title(f"{axis}: step s ∝ x^{a['exponent_step_seconds']:.2f}")
        panel.set_xlabel(axis)
        panel.set_ylabel("seconds")
        panel.grid(True, which="both", alpha=0.3)
        panel.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--axes", nargs="+", default=list(AXES), choices=list(AXES))
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
