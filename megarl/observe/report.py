"""`megarl report`: a run's curves as PNGs and a report.md; several runs overlaid with a compare.md.

    write_report([Path("outputs/grpo")])                    # outputs/grpo/report/report.md + *.png
    write_report([Path("runs/a"), Path("runs/b")])          # runs/a/report/compare/compare.md + *.png

report.md holds the totals (steps, samples, tokens, wall time and its share per stage), the validation
scores (first, last, best), the plots, the machine, the layout per role and the resolved config. The
trainer writes it at the end of every run, also of one that crashed (`try_write_report`); it reports
what the files hold and says what is missing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from megarl.observe.plots import (
    AGENT_PREFIX,
    PLOT_NAMES,
    PLOTS,
    TIMING_NAME,
    plot_run,
    plot_runs,
    stage_seconds,
)
from megarl.observe.progress import format_duration
from megarl.observe.run_files import CONFIG, METRICS, RUN_INFO, Run, read_run

log = logging.getLogger("megarl.observe")

REPORT_DIR = "report"
VAL_KEY = "val/reward/mean"
_TITLES = {p.name: p.title for p in PLOTS} | {TIMING_NAME: "Time per step, by stage"}


def write_report(run_dirs: list[Path], out_dir: Path | None = None) -> Path:
    """The report of one run (`<run>/report/report.md`) or the comparison of several
    (`<first run>/report/compare/compare.md`), with their PNGs, into `out_dir` if given. Returns the
    markdown file. FileNotFoundError (naming the path) for a directory without metrics.jsonl."""
    if not run_dirs:
        raise ValueError("write_report needs at least one run directory")
    runs = [read_run(d) for d in run_dirs]
    if len(runs) == 1:
        out = Path(out_dir) if out_dir else runs[0].path / REPORT_DIR
        written, missing = plot_run(runs[0], out)
        text = single_report(runs[0], written, missing)
        path = out / "report.md"
    else:
        out = Path(out_dir) if out_dir else runs[0].path / REPORT_DIR / "compare"
        written, missing = plot_runs(runs, out)
        text = compare_report(runs, written, missing)
        path = out / "compare.md"
    for name in PLOT_NAMES:  # a plot an earlier report drew but this one could not: not left behind
        stale = out / f"{name}.png"
        if stale not in written:
            stale.unlink(missing_ok=True)
    path.write_text(text)
    return path


def try_write_report(output_dir: str | Path, say: Callable[[str], Any] | None = None) -> Path | None:
    """`write_report` of one run that never raises: a report must not fail a finished run. A failure is
    logged as one line; `say` (e.g. the progress log's `message`) gets the report's path."""
    try:
        path = write_report([Path(output_dir)])
    except Exception as e:  # any failure of the report is only worth a line
        log.warning("megarl: no report for %s (%s: %s)", output_dir, type(e).__name__, e)
        return None
    if say is not None:
        say(f"megarl: report {path}")
    return path


def single_report(run: Run, plots: list[Path], missing: dict[str, str]) -> str:
    """report.md of one run, linking the PNGs in `plots` (which lie next to it)."""
    lines = [f"# Run report: {run.name}", "", f"Run directory: `{run.path}`", ""]
    if run.problems:
        lines += ["**Incomplete run.** " + " ".join(run.problems), ""]
    lines += ["## Totals", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in totals(run).items()]
    lines += ["", "## Validation", ""] + _validation_section(run)
    lines += ["", "## Time per stage", ""] + _stage_table(run)
    if agent := _agent_section(run):
        lines += ["", "## Multi-turn rollouts", ""] + agent
    lines += ["", "## Plots", ""]
    for png in plots:
        lines += [f"![{_TITLES.get(png.stem, png.stem)}]({png.name})", ""]
    if missing:
        lines += ["Not plotted (no data):", ""] + [f"- {name}: {why}" for name, why in missing.items()] + [""]
    lines += _non_finite_section(run)
    lines += ["## Machine", ""] + _machine_section(run)
    lines += ["", "## Layout per role", ""] + _layout_section(run)
    lines += ["", "## Config", ""]
    if run.config_text is None:
        lines.append(f"No {CONFIG} in the run directory (the trainer writes it when the run starts).")
    else:
        lines += ["```yaml", run.config_text.rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def compare_report(runs: list[Run], plots: list[Path], missing: dict[str, str]) -> str:
    """compare.md: one table row per run (validation first/last/best, final train reward, wall time)."""
    lines = [f"# Comparison of {len(runs)} runs", ""]
    header = "| run | steps | val first | val last | val best | final train reward | wall time | complete |"
    lines += [header, "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        val = validation_points(run)
        reward = _last_finite(run, "reward/mean")
        cells = [
            f"`{run.name}`",
            str(len(run.train)),
            *(_at_step(val, which) for which in ("first", "last", "best")),
            _num(reward[1]) if reward else "—",
            format_duration(wall_seconds(run)),
            "yes" if not run.problems else "no",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Run directories:", ""]
    for run in runs:
        problems = f" — incomplete: {' '.join(run.problems)}" if run.problems else ""
        lines.append(f"- `{run.name}`: `{run.path}`{problems}")
    lines += ["", "## Plots", ""]
    for png in plots:
        lines += [f"![{_TITLES.get(png.stem, png.stem)}]({png.name})", ""]
    if missing:
        lines += ["Not plotted (no data):", ""] + [f"- {name}: {why}" for name, why in missing.items()]
    return "\n".join(lines) + "\n"


def totals(run: Run) -> dict[str, str]:
    """The totals table of report.md, as {label: value text}."""
    train = run.train
    planned = run.planned_steps()
    out = {"training steps": f"{len(train)}" + (f" of {planned} planned" if planned else "")}
    batch, n = run.setting("data", "train_batch_size"), run.setting("rollout", "n")
    counted = [h["batch/sequences"] for h in train if "batch/sequences" in h]
    if counted and len(counted) == len(train):  # what the steps trained on (dynamic sampling, PF-PPO)
        out["samples"] = f"{int(sum(counted)):,} (sequences trained on over {len(train)} steps)"
    elif batch and n:
        out["samples"] = (
            f"{batch * n * len(train):,} (train_batch_size {batch} × rollout.n {n} × {len(train)} steps)"
        )
    else:
        out["samples"] = f"unknown (no {CONFIG} with data.train_batch_size and rollout.n)"
    tokens = [
        h["throughput/tokens_per_s"] * h["step_seconds"]
        for h in train
        if "throughput/tokens_per_s" in h and "step_seconds" in h
    ]
    tokens = [t for t in tokens if math.isfinite(t)]
    out["tokens"] = (
        f"{round(sum(tokens)):,} (prompt + response, over {len(tokens)} steps)"
        if tokens
        else "unknown (no throughput/tokens_per_s)"
    )
    step = sum(_finite(run, "step_seconds", train_only=True))
    validate = sum(_finite(run, "timing/validate"))
    wall = step + validate
    out["wall time"] = (
        f"{format_duration(wall)} ({wall:.1f} s = {step:.1f} s of steps + {validate:.1f} s validation)"
    )
    if train:
        out["mean step time"] = f"{step / len(train):.2f} s"
    reward = _last_finite(run, "reward/mean")
    out["final train reward"] = f"{_num(reward[1])} (step {reward[0]})" if reward else "—"
    return out


def wall_seconds(run: Run) -> float:
    """Σ step_seconds over training steps + Σ timing/validate."""
    return sum(_finite(run, "step_seconds", train_only=True)) + sum(_finite(run, "timing/validate"))


def validation_points(run: Run, key: str = VAL_KEY) -> dict[str, tuple[int, float]]:
    """{"first" | "last" | "best": (step, score)} of `key` (higher is better; the earliest best wins)."""
    points = [(s, v) for s, v in zip(*run.series(key)) if math.isfinite(v)]
    if not points:
        return {}
    return {"first": points[0], "last": points[-1], "best": max(points, key=lambda p: (p[1], -p[0]))}


def _validation_section(run: Run) -> list[str]:
    sources = sorted(
        k for k in run.keys() if k.startswith("val/") and k.endswith("/reward/mean") and k != VAL_KEY
    )
    keys = [VAL_KEY] + (sources if len(sources) > 1 else [])
    if not validation_points(run):
        offline = sorted(k for k in run.keys() if k.startswith("val/"))  # SFT, preference training
        if offline:
            return _first_and_last(run, offline)
        return [f"No validation scores ({VAL_KEY}) in {METRICS}: data.val_files unset, or none ran yet."]
    lines = ["| score | first | last | best |", "|---|---|---|---|"]
    for key in keys:
        val = validation_points(run, key)
        cells = [_at_step(val, which) for which in ("first", "last", "best")]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def _first_and_last(run: Run, keys: list[str]) -> list[str]:
    """Every validation metric at its first and last step (no "best": for some lower is better)."""
    lines = ["| metric | first | last |", "|---|---|---|"]
    for key in keys:
        points = [(s, v) for s, v in zip(*run.series(key)) if math.isfinite(v)]
        if points:
            val = {"first": points[0], "last": points[-1]}
            lines.append(f"| {key} | {_at_step(val, 'first')} | {_at_step(val, 'last')} |")
    return lines


def _agent_section(run: Run) -> list[str]:
    """The agent/ metrics of a multi-turn run (turns, tool calls, tool errors by outcome, split samples):
    first, last and mean over the training steps; [] for a run without them."""
    keys = sorted(k for k in run.keys() if k.startswith(AGENT_PREFIX))
    if not keys:
        return []
    lines = ["| metric | first | last | mean over steps |", "|---|---|---|---:|"]
    for key in keys:
        points = [(s, v) for s, v in zip(*run.series(key, train_only=True)) if math.isfinite(v)]
        if points:
            val = {"first": points[0], "last": points[-1]}
            mean = sum(v for _, v in points) / len(points)
            lines.append(f"| {key} | {_at_step(val, 'first')} | {_at_step(val, 'last')} | {_num(mean)} |")
    lines += [
        "",
        "turns and tool calls are per sample; agent/tool_errors/<outcome> counts a step's failed tool calls "
        "(the model read an error message instead of a result); agent/split_samples counts the extra "
        "samples of conversations split because an agent's next request did not extend their tokens.",
    ]
    return lines


def _at_step(points: dict[str, tuple[int, float]], which: str) -> str:
    if which not in points:
        return "—"
    step, value = points[which]
    return f"{_num(value)} (step {step})"


def _stage_table(run: Run) -> list[str]:
    seconds = stage_seconds(run)
    wall = sum(seconds.values())
    if not wall:
        return [f"No timings (timing/<stage>, step_seconds) in {METRICS}."]
    n = max(len(run.train), 1)
    lines = ["| stage | seconds | share | per training step |", "|---|---:|---:|---:|"]
    for stage, t in seconds.items():
        per_step = "" if stage == "validate" else f"{t / n:.3f} s"
        lines.append(f"| {stage} | {t:.1f} | {100 * t / wall:.1f}% | {per_step} |")
    lines.append(f"| **total** | {wall:.1f} | 100.0% | |")
    lines += [
        "",
        '"other" is time inside a training step outside its stages (e.g. drawing the next prompts).',
    ]
    return lines


def _non_finite_section(run: Run) -> list[str]:
    bad: dict[str, list[int]] = {}
    for h in run.history:
        for k, v in h.items():
            if not math.isfinite(v):
                bad.setdefault(k, []).append(int(h["step"]))
    if not bad:
        return []
    lines = ["Non-finite values (gaps in the curves):", ""]
    lines += [f"- {k}: steps {', '.join(map(str, steps))}" for k, steps in sorted(bad.items())]
    return lines + [""]


def _machine_section(run: Run) -> list[str]:
    info = (run.run_info or {}).get("machine")
    if not info:
        return [f"No {RUN_INFO} in the run directory (the trainer writes it when the run starts)."]
    gpus = info.get("gpus") or []
    gpu_text = "none"
    if gpus:
        names = sorted({g.get("name", "?") for g in gpus})
        memory = gpus[0].get("memory_gib")
        gpu_text = f"{len(gpus)} × {', '.join(names)}" + (f" ({memory} GiB each)" if memory else "")
    versions = ", ".join(f"{k} {v}" for k, v in (info.get("versions") or {}).items() if v)
    rows = {
        "host": info.get("hostname"),
        "CPU": f"{info.get('cpu')} ({info.get('logical_cpus')} logical CPUs)",
        "RAM": f"{info.get('ram_gib')} GiB",
        "GPUs": gpu_text,
        "OS": info.get("platform"),
        "Python": info.get("python"),
        "versions": versions,
        "started": (run.run_info or {}).get("started"),
        "command": f"`{info['command']}`" if info.get("command") else None,
    }
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows.items() if v is not None]


def _layout_section(run: Run) -> list[str]:
    layout = (run.run_info or {}).get("layout")
    if not layout:
        return [f"No {RUN_INFO} in the run directory."]
    lines = [
        "| role | layout | devices | tp | pp | cp | ep | vpp | sequence parallel |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for role, e in layout.items():
        if role == "rollout":
            continue
        cells = [role] + [e.get(k) for k in ("layout", "n_devices", "tp", "pp", "cp", "ep")]
        cells += [e.get("vpp") or "—", "yes" if e.get("sequence_parallel") else "no"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if "rollout" in layout:
        r = layout["rollout"]
        lines += [
            "",
            f"Rollout: {r.get('engine')} engine, generation tp {r.get('tp')}, {r.get('n')} samples per prompt.",
        ]
    return lines


def _finite(run: Run, key: str, train_only: bool = False) -> list[float]:
    return [v for v in run.series(key, train_only)[1] if math.isfinite(v)]


def _last_finite(run: Run, key: str) -> tuple[int, float] | None:
    points = [(s, v) for s, v in zip(*run.series(key, train_only=True)) if math.isfinite(v)]
    return points[-1] if points else None


def _num(value: float) -> str:
    return f"{value:.4g}"


def describe(path: Path) -> str:
    """What `megarl report` prints: the markdown file, then every PNG next to it."""
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    return "\n".join([str(path)] + [f"  {path.parent / name}" for name in pngs])
