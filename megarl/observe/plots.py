"""PNG curves of one run, or of several runs overlaid, from their metrics.jsonl (see `run_files.Run`).

    written, missing = plot_run(run, out_dir)      # reward.png, kl.png, ...; missing: {name: why}
    written, missing = plot_runs(runs, out_dir)    # the same curves, one colour per run

Which plots exist is the `PLOTS` table (plus the per-stage timing chart); a plot none of whose metrics
were logged is skipped and named in `missing`. Figures are drawn on matplotlib's Agg canvas (no display,
no pyplot state), so this runs on headless nodes and inside the trainer process.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megarl.observe.run_files import Run

FIGSIZE = (8.0, 4.5)  # inches; at DPI 110 a 880×495 PNG that reads well inline in a markdown viewer
DPI = 110
# fixed margins (fractions of the figure): a layout engine would draw every figure twice
MARGINS = {"left": 0.11, "right": 0.97, "bottom": 0.12, "top": 0.89}
LEGEND_RIGHT = 0.78  # the right edge of the axes when the legend sits beside them
STAGE_LABELS_LEFT = 0.2  # the left edge of the axes when stage names label the y axis
LINESTYLES = ("-", "--", ":", "-.")
STAGE_PREFIX = "timing/"
VALIDATE = "timing/validate"


@dataclass(frozen=True)
class Curve:
    key: str  # the metric
    label: str  # its legend entry


@dataclass(frozen=True)
class Plot:
    name: str  # file stem: <out_dir>/<name>.png
    title: str
    ylabel: str  # with units
    curves: tuple[Curve, ...]
    log_y: bool = False
    # also a curve for every other metric whose name starts with this (labelled by the rest of the name)
    prefix: str | None = None


PLOTS: tuple[Plot, ...] = (
    Plot(
        "reward",
        "Reward",
        "score per response",
        (Curve("reward/mean", "train mean"), Curve("val/reward/mean", "validation mean")),
    ),
    Plot(
        "kl",
        "KL divergence to the reference policy",
        "KL per token (nats)",
        (Curve("kl/mean", "in-reward KL (kl/mean)"), Curve("actor/kl_loss", "KL loss term (actor/kl_loss)")),
    ),
    Plot("entropy", "Policy entropy", "entropy per token (nats)", (Curve("actor/entropy", "entropy"),)),
    Plot(
        "response_length",
        "Response length",
        "tokens",
        (Curve("response_length/mean", "mean"), Curve("response_length/max", "max")),
    ),
    Plot(
        "clip_frac", "PPO clip fraction", "fraction of tokens clipped", (Curve("actor/clip_frac", "clipped"),)
    ),
    Plot("grad_norm", "Actor gradient norm", "global L2 norm", (Curve("actor/grad_norm", "grad norm"),)),
    Plot("lr", "Actor learning rate", "learning rate", (Curve("actor/lr", "lr"),)),
    Plot("value_loss", "Critic value loss", "loss", (Curve("critic/value_loss", "value loss"),)),
    Plot(
        "logprob_diff",
        "Trainer vs rollout log-probs of the sampled tokens",
        "|Δ log-prob| per token (log scale)",
        (
            Curve("train_rollout_logprob_abs_diff", "mean over tokens"),
            Curve("train_rollout_logprob_abs_diff_max", "max over tokens"),
        ),
        log_y=True,
    ),
    Plot("throughput", "Throughput", "tokens per second", (Curve("throughput/tokens_per_s", "tokens/s"),)),
    # the offline trainers (megarl sft, megarl dpo|ipo|kto|orpo|simpo, megarl rm)
    Plot(
        "sft_loss",
        "SFT loss",
        "NLL per response token",
        (Curve("sft/loss", "train"), Curve("val/loss", "validation")),
    ),
    Plot(
        "preference_loss",
        "Preference loss",
        "loss per pair",
        (Curve("pref/loss", "train"), Curve("val/pref/loss", "validation")),
    ),
    Plot(
        "preference_rewards",
        "Implicit rewards",
        "reward (β · log-ratio, or β · mean log-prob)",
        (
            Curve("rewards/chosen", "chosen"),
            Curve("rewards/rejected", "rejected"),
            Curve("rewards/margin", "margin"),
            Curve("val/rewards/margin", "validation margin"),
        ),
    ),
    Plot(
        "preference_accuracy",
        "Preference accuracy",
        "fraction of pairs with reward(chosen) > reward(rejected)",
        (Curve("rewards/accuracy", "train"), Curve("val/rewards/accuracy", "validation")),
    ),
    Plot(
        "rm_loss",
        "Reward-model loss",
        "Bradley–Terry loss per pair",
        (Curve("rm/loss", "train"), Curve("val/rm/loss", "validation")),
    ),
    Plot(
        "rm_accuracy",
        "Reward-model accuracy",
        "fraction of pairs with score(chosen) > score(rejected)",
        (Curve("rm/accuracy", "train"), Curve("val/rm/accuracy", "validation")),
    ),
)
# multi-turn rollouts (rollout.multi_turn, megarl.agentic): drawn when the run logged agent/ metrics, and
# not listed as missing when it logged none
AGENT_PREFIX = "agent/"
AGENT_PLOTS = (
    Plot(
        "agent_turns",
        "Assistant turns and tool calls per sample",
        "per sample (mean)",
        (Curve("agent/turns/mean", "assistant turns"), Curve("agent/tool_calls/mean", "tool calls")),
    ),
    Plot(
        "tool_errors",
        "Failed tool calls, by outcome",
        "calls per step",
        (),
        prefix="agent/tool_errors/",
    ),
    Plot(
        "split_samples",
        "Conversations split into several samples",
        "samples per step",
        (Curve("agent/split_samples", "split samples"),),
    ),
)
PLOTS = PLOTS + AGENT_PLOTS
OFFLINE_PLOTS = (
    "sft_loss",
    "preference_loss",
    "preference_rewards",
    "preference_accuracy",
    "rm_loss",
    "rm_accuracy",
)
TIMING_NAME = "timing"  # the per-stage chart, drawn by its own function
PLOT_NAMES = tuple(p.name for p in PLOTS) + (TIMING_NAME,)


def plot_run(run: Run, out_dir: Path) -> tuple[list[Path], dict[str, str]]:
    """Every plot of `run` that has data, as `<out_dir>/<name>.png`; also {plot name: why it is missing}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written, missing = [], {}
    for plot in PLOTS:
        present = [c for c in curves_of(plot, [run]) if _finite(run.series(c.key)[1])]
        if not present:
            if _listed_missing(plot, [run]):
                missing[plot.name] = _missing_reason(plot, [run])
            continue
        fig, ax = _figure(plot.title, run.name)
        for i, curve in enumerate(present):
            steps, values = run.series(curve.key)
            _line(ax, steps, values, curve, curve.label, color=f"C{i}", style="-")
        _EXTRAS.get(plot.name, _no_extras)(ax, run, present)
        written.append(_save(fig, ax, plot, out_dir))
    if any(stage_seconds(run).values()):
        written.append(_timing_chart(run, out_dir))
    else:
        missing[TIMING_NAME] = "no timing/<stage> or step_seconds in metrics.jsonl"
    return written, missing


def plot_runs(runs: list[Run], out_dir: Path) -> tuple[list[Path], dict[str, str]]:
    """The curves of several runs overlaid (one colour per run, one line style per metric)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = _run_labels(runs)
    written, missing = [], {}
    for plot in PLOTS:
        curves = curves_of(plot, runs)
        if not any(_finite(r.series(c.key)[1]) for r in runs for c in curves):
            if _listed_missing(plot, runs):
                missing[plot.name] = _missing_reason(plot, runs)
            continue
        fig, ax = _figure(plot.title, f"{len(runs)} runs")
        for i, (run, label) in enumerate(zip(runs, labels)):
            for j, curve in enumerate(curves):
                steps, values = run.series(curve.key)
                if _finite(values):
                    name = label if len(curves) == 1 else f"{label} · {curve.label}"
                    _line(ax, steps, values, curve, name, color=f"C{i % 10}", style=LINESTYLES[j % 4])
        written.append(_save(fig, ax, plot, out_dir))
    if any(_stages(r) and any(stage_seconds(r).values()) for r in runs):
        written.append(_timing_comparison(runs, labels, out_dir))
    else:
        missing[TIMING_NAME] = "no run logged timing/<stage>"
    return written, missing


def stage_seconds(run: Run) -> dict[str, float]:
    """Seconds spent per stage over the whole run, largest first: each timing/<stage>, "other" (time of a
    step outside its stages) and "validate" last. They sum to the run's wall time."""
    totals = {s: sum(_finite(run.series(STAGE_PREFIX + s, train_only=True)[1])) for s in _stages(run)}
    totals = dict(sorted(totals.items(), key=lambda kv: -kv[1]))
    step = sum(_finite(run.series("step_seconds", train_only=True)[1]))
    other = step - sum(totals.values())
    if other > 1e-9 * max(step, 1.0):
        totals["other"] = other
    validate = sum(_finite(run.series(VALIDATE)[1]))
    if validate:
        totals["validate"] = validate
    return totals


def _stages(run: Run) -> list[str]:
    return sorted(k[len(STAGE_PREFIX) :] for k in run.keys() if k.startswith(STAGE_PREFIX) and k != VALIDATE)


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def curves_of(plot: Plot, runs: list[Run]) -> list[Curve]:
    """The plot's curves, and one per logged metric under its prefix (sorted by name)."""
    curves = list(plot.curves)
    if plot.prefix:
        keys = sorted({k for r in runs for k in r.keys() if k.startswith(plot.prefix)})
        curves += [Curve(k, k[len(plot.prefix) :]) for k in keys]
    return curves


def _listed_missing(plot: Plot, runs: list[Run]) -> bool:
    """Whether a plot without data is named in the report: an agent plot only in runs with agent metrics."""
    if plot not in AGENT_PLOTS:
        return True
    return any(k.startswith(AGENT_PREFIX) for r in runs for k in r.keys())


def _missing_reason(plot: Plot, runs: list[Run]) -> str:
    keys = " or ".join([c.key for c in plot.curves] + ([f"{plot.prefix}<name>"] if plot.prefix else []))
    logged = any(r.has(c.key) for r in runs for c in plot.curves)
    return f"{keys}: only non-finite values" if logged else f"no {keys} in metrics.jsonl"


def _run_labels(runs: list[Run]) -> list[str]:
    """The run directories' names, made unique with their parent's name where two are alike."""
    names = [r.name for r in runs]
    return [f"{r.path.resolve().parent.name}/{n}" if names.count(n) > 1 else n for r, n in zip(runs, names)]


def _figure(title: str, subtitle: str, **margins: float) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    fig.subplots_adjust(**(MARGINS | margins))
    ax = fig.subplots()
    ax.set_axisbelow(True)
    ax.set_title(title, loc="left", fontsize=12, fontweight="bold")
    ax.set_title(subtitle, loc="right", fontsize=9, color="0.4")
    ax.grid(True, alpha=0.3)
    return fig, ax


def _line(
    ax: Any, steps: list[int], values: list[float], curve: Curve, label: str, color: str, style: str
) -> None:
    # markers where points are few or sparse (validation every N steps), else a plain line
    marker = "o" if len(steps) <= 40 or curve.key.startswith("val/") else None
    ax.plot(steps, values, style, color=color, label=label, marker=marker, markersize=4)


def _save(fig: Any, ax: Any, plot: Plot, out_dir: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    positive = any(v > 0 for line in ax.get_lines() for v in line.get_ydata() if math.isfinite(v))
    if plot.log_y and positive:  # zeros (e.g. identical log-probs) cannot be drawn on a log axis: gaps
        ax.set_yscale("log", nonpositive="mask")
    else:  # 1e-6 rather than 0.000001: tick labels stay narrow
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useOffset=False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(_step_label(any(0 in line.get_xdata() for line in ax.get_lines())))
    ax.set_ylabel(plot.ylabel)
    ax.legend(loc="best", fontsize=9)
    path = out_dir / f"{plot.name}.png"
    fig.savefig(path)
    return path


def _step_label(step0: bool) -> str:
    return "training step (0 = validation before training)" if step0 else "training step"


def _reward_extras(ax: Any, run: Run, present: list[Curve]) -> None:
    """A min–max band and a ±std band around the train mean; one validation line per data source."""
    rows = [h for h in run.train if math.isfinite(h.get("reward/mean", math.nan))]
    if rows:
        steps = [h["step"] for h in rows]
        if all("reward/min" in h and "reward/max" in h for h in rows):
            lo, hi = [h["reward/min"] for h in rows], [h["reward/max"] for h in rows]
            ax.fill_between(steps, lo, hi, color="C0", alpha=0.1, linewidth=0, label="train min–max")
        if all("reward/std" in h for h in rows):
            mean, std = [h["reward/mean"] for h in rows], [h["reward/std"] for h in rows]
            lo, hi = [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)]
            ax.fill_between(steps, lo, hi, color="C0", alpha=0.22, linewidth=0, label="train ±1 std")
    sources = sorted(
        k
        for k in run.keys()
        if k.startswith("val/") and k.endswith("/reward/mean") and k != "val/reward/mean"
    )
    if len(sources) > 1:  # with one source its line is the overall validation line
        for i, key in enumerate(sources, 2):
            steps, values = run.series(key)
            source = key[len("val/") : -len("/reward/mean")]
            ax.plot(
                steps,
                values,
                ":",
                color=f"C{i % 10}",
                marker="s",
                markersize=3,
                label=f"validation: {source}",
            )


def _response_length_extras(ax: Any, run: Run, present: list[Curve]) -> None:
    limit = run.setting("rollout", "max_tokens") or run.setting("data", "max_response_length")
    if limit:
        ax.axhline(limit, color="0.5", linestyle="--", linewidth=1, label=f"limit ({limit} tokens)")


def _grad_norm_extras(ax: Any, run: Run, present: list[Curve]) -> None:
    clip = run.setting("actor", "optimizer", "clip_grad")
    if clip:
        ax.axhline(clip, color="0.5", linestyle="--", linewidth=1, label=f"clip_grad = {clip:g}")


def _no_extras(ax: Any, run: Run, present: list[Curve]) -> None:
    pass


_EXTRAS: dict[str, Callable[[Any, Run, list[Curve]], None]] = {
    "reward": _reward_extras,
    "response_length": _response_length_extras,
    "grad_norm": _grad_norm_extras,
}


def _timing_chart(run: Run, out_dir: Path) -> Path:
    """Seconds per step, stacked by stage (largest first), validation hatched on top."""
    fig, ax = _figure("Time per step, by stage", run.name, right=LEGEND_RIGHT)
    totals = stage_seconds(run)
    steps = [int(h["step"]) for h in run.history]
    bottom = [0.0] * len(steps)
    colors = _stage_colors(list(totals))
    many = len(steps) > 60
    for stage in totals:
        heights = [_stage_time(h, stage) for h in run.history]
        hatch = "//" if stage == "validate" else None
        ax.bar(
            steps,
            heights,
            bottom=bottom,
            width=0.8,
            color=colors[stage],
            label=stage,
            hatch=hatch,
            edgecolor="white" if not many else "none",
            linewidth=0.3,
        )
        bottom = [b + v for b, v in zip(bottom, heights)]
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(_step_label(run.has_step0))
    ax.set_ylabel("seconds")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, title="stage")
    path = out_dir / f"{TIMING_NAME}.png"
    fig.savefig(path)
    return path


def _stage_time(h: dict[str, float], stage: str) -> float:
    if stage == "validate":
        value = h.get(VALIDATE, 0.0)
    elif stage == "other":
        if h["step"] == 0 or "step_seconds" not in h:
            return 0.0
        inside = sum(
            v for k, v in h.items() if k.startswith(STAGE_PREFIX) and k != VALIDATE and math.isfinite(v)
        )
        value = max(h["step_seconds"] - inside, 0.0)
    else:
        value = h.get(STAGE_PREFIX + stage, 0.0) if h["step"] > 0 else 0.0
    return value if math.isfinite(value) else 0.0


def _stage_colors(stages: list[str]) -> dict[str, Any]:
    """Distinct hues for the stages (tab10 without its gray, then tab20's light shades); grays for
    "other" and "validate"."""
    from matplotlib import colormaps

    tab10, tab20 = colormaps["tab10"].colors, colormaps["tab20"].colors
    palette = [c for i, c in enumerate(tab10) if i != 7] + [
        c for i, c in enumerate(tab20) if i % 2 and i != 15
    ]
    named = [s for s in stages if s not in ("other", "validate")]
    colors = {s: palette[i % len(palette)] for i, s in enumerate(named)}
    colors.update(other="0.78", validate="0.45")
    return colors


def _timing_comparison(runs: list[Run], labels: list[str], out_dir: Path) -> Path:
    """Mean seconds per training step of each stage, one bar per run."""
    fig, ax = _figure("Mean time per training step, by stage", f"{len(runs)} runs", left=STAGE_LABELS_LEFT)
    per_run = []
    for run in runs:
        totals = stage_seconds(run)
        totals.pop("validate", None)
        n = max(len(run.train), 1)
        per_run.append({s: t / n for s, t in totals.items()})
    # the slowest stage on top, "other" at the bottom
    stages = sorted(
        {s for t in per_run for s in t}, key=lambda s: (s != "other", max(t.get(s, 0.0) for t in per_run))
    )
    height = 0.8 / len(runs)
    for i, (means, label) in enumerate(zip(per_run, labels)):
        ys = [k + ((len(runs) - 1) / 2 - i) * height for k in range(len(stages))]
        ax.barh(ys, [means.get(s, 0.0) for s in stages], height=height, color=f"C{i % 10}", label=label)
    ax.set_yticks(range(len(stages)), stages)
    ax.grid(True, axis="y", alpha=0)
    ax.set_xlabel("seconds per training step")
    ax.legend(loc="lower right", fontsize=9)
    path = out_dir / f"{TIMING_NAME}.png"
    fig.savefig(path)
    return path
