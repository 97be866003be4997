"""The files of one run directory (`trainer.output_dir`), written at its start and read back by reports.

    write_run_files(cfg, output_dir)   # config.yaml (resolved config) + run_info.json (machine, layouts)
    run = read_run("outputs/quickstart/grpo")
    run.series("reward/mean")          # ([1, 2, ...], [0.41, 0.44, ...]); non-finite values as nan
    run.problems                       # why the run looks incomplete: cut-off last line, no summary.json

A run still going, or one that crashed, has what it has: a cut-off last line of metrics.jsonl is skipped
and flagged, summary.json / config.yaml / run_info.json may be missing, and any metric may be absent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from megarl.observe.machine import machine_info, role_layouts

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"
RUN_INFO = "run_info.json"


def write_run_files(cfg: Any, output_dir: str | Path) -> None:
    """`config.yaml` (the resolved config, every field) and `run_info.json` (start time, machine, layout
    per role) of a run of `cfg` (a MegarlConfig) starting in `output_dir`. An earlier run's summary.json
    there is removed: this run's history starts afresh, and so does its verdict."""
    from megarl.config import config_to_yaml

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(config_to_yaml(cfg))
    info = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "layout": role_layouts(cfg),
    }
    (out / RUN_INFO).write_text(json.dumps(info, indent=2) + "\n")
    (out / SUMMARY).unlink(missing_ok=True)


@dataclass
class Run:
    """What one run directory holds. `history` is one dict per logged step (`step` first), numbers only."""

    path: Path
    history: list[dict[str, float]]
    truncated: bool = False  # the last line of metrics.jsonl was cut off (the run was writing or died)
    bad_lines: list[int] = field(default_factory=list)  # other lines that are not JSON objects (1-based)
    summary: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    config_text: str | None = None
    run_info: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.path.resolve().name

    @property
    def train(self) -> list[dict[str, float]]:
        """The training steps (step 0 is the validation before training)."""
        return [h for h in self.history if h["step"] > 0]

    @property
    def has_step0(self) -> bool:
        return any(h["step"] == 0 for h in self.history)

    def has(self, key: str) -> bool:
        return any(key in h for h in self.history)

    def keys(self) -> set[str]:
        return {k for h in self.history for k in h}

    def series(self, key: str, train_only: bool = False) -> tuple[list[int], list[float]]:
        """(steps, values) of the steps that logged `key`, in step order."""
        rows = self.train if train_only else self.history
        pairs = [(int(h["step"]), h[key]) for h in rows if key in h]
        return [s for s, _ in pairs], [v for _, v in pairs]

    def planned_steps(self) -> int | None:
        """trainer.total_steps from summary.json or the config (None when neither says)."""
        if self.summary and isinstance(self.summary.get("steps"), int):
            return self.summary["steps"]
        return self.setting("trainer", "total_steps")

    def setting(self, *keys: str) -> Any:
        """A value of the resolved config (`run.setting("data", "train_batch_size")`), None if unknown."""
        node: Any = self.config
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    @property
    def problems(self) -> list[str]:
        """Why this run's files look incomplete, one sentence each; empty for a finished run."""
        out = []
        if self.truncated:
            out.append(
                f"The last line of {METRICS} is cut off (the run was still writing it, or died); it was skipped."
            )
        if self.bad_lines:
            out.append(
                f"Lines {', '.join(map(str, self.bad_lines))} of {METRICS} are not JSON step records; they were skipped."
            )
        if self.summary is None:
            out.append(f"There is no {SUMMARY}: the run is still going, or it crashed or was interrupted.")
        planned, done = self.planned_steps(), len(self.train)
        if planned is not None and done < planned:
            out.append(f"{done} of {planned} planned training steps are recorded.")
        if not self.history:
            out.append(f"{METRICS} holds no steps.")
        return out


def read_run(run_dir: str | Path) -> Run:
    """The files of `run_dir`; FileNotFoundError (naming the path) when it has no metrics.jsonl."""
    path = Path(run_dir)
    metrics = path / METRICS
    if not metrics.is_file():
        what = "does not exist" if not path.exists() else f"has no {METRICS}"
        raise FileNotFoundError(
            f"{path} {what}; point at a run's trainer.output_dir (where {METRICS} is written)"
        )
    history, truncated, bad = _read_history(metrics)
    config_text = _read_text(path / CONFIG)
    return Run(
        path=path,
        history=history,
        truncated=truncated,
        bad_lines=bad,
        summary=_read_json(path / SUMMARY),
        config=_parse_yaml(config_text),
        config_text=config_text,
        run_info=_read_json(path / RUN_INFO),
    )


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The step records of a metrics.jsonl ([] when it does not exist), by step; a cut-off or corrupt
    line is skipped."""
    path = Path(path)
    return _read_history(path)[0] if path.is_file() else []


def _read_history(path: Path) -> tuple[list[dict[str, float]], bool, list[int]]:
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    # a file whose last write completed ends with "\n"; anything after the last "\n" is a partial line
    partial = lines.pop() if lines else ""
    history, bad = [], []
    for number, line in enumerate(lines, 1):
        if line.strip():
            record = _record(line)
            if record is None:
                bad.append(number)
            else:
                history.append(record)
    truncated = False
    if partial.strip():
        record = _record(partial)  # a complete object whose newline is missing still counts
        if record is None:
            truncated = True
        else:
            history.append(record)
    history.sort(key=lambda h: h["step"])
    return history, truncated, bad


def _record(line: str) -> dict[str, float] | None:
    """One step's numbers; "nan"/"inf" strings (how metrics.jsonl stores non-finite floats) as floats."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("step"), int):
        return None
    record: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                continue
        if isinstance(value, (int, float)):
            record[key] = value
    return record


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _parse_yaml(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return value if isinstance(value, dict) else None
