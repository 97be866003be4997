"""Step metrics to where a person reads them: one console line per step and `metrics.jsonl`.

The console line is plain text (readable in a SLURM log or a pipe):

    step 3/10 | reward 0.412 ±0.31 | val 0.500 | kl 0.0012 | entropy 1.23 | resp 7.1 tok | 1234 tok/s | 12.3s | ETA 1m26s

The console shows every `logging.log_every`-th step (and the first, the last and validation steps);
`<output_dir>/metrics.jsonl` (always; `logging.backends` picks the other sinks) gets one JSON object per step (`step` plus every metric), appended and flushed at once,
so a run that dies keeps every finished step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _number(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    return f"{value:.3g}" if abs(value) < 1e-2 else f"{value:.3f}"


# (metric, label) pairs of the console line, in order; absent metrics are skipped
_CONSOLE = (
    ("sft/loss", "loss"),
    ("val/reward/mean", "val"),
    ("kl/mean", "kl"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/entropy", "entropy"),
    ("critic/value_loss", "vf_loss"),
)


class ProgressLog:
    """Writes each step's metrics to the console and to `<output_dir>/metrics.jsonl`."""

    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        backends: list[str],
        stream: TextIO | None = None,
        every: int = 1,
        writer: bool = True,
    ) -> None:
        self.total_steps = total_steps
        self.every = every
        self.console = writer and "console" in backends
        self.stream = stream
        # metrics.jsonl is always written (by the one writing process); a new run starts it afresh
        self.path = Path(output_dir) / "metrics.jsonl" if writer else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
        self._step_seconds: list[float] = []

    @classmethod
    def for_run(cls, cfg: Any, total_steps: int, writer: bool, stream: TextIO | None = None) -> ProgressLog:
        """The log of a run of `cfg` (a MegarlConfig): trainer.output_dir, logging.backends/log_every."""
        return cls(
            cfg.trainer.output_dir,
            total_steps,
            cfg.logging.backends,
            stream=stream,
            every=cfg.logging.log_every,
            writer=writer,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in sorted(metrics.items())}}
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if "step_seconds" in metrics:
            self._step_seconds.append(float(metrics["step_seconds"]))
        if self.console and (
            step % self.every == 0 or step in (1, self.total_steps) or "val/reward/mean" in metrics
        ):
            print(self.line(step, metrics), file=self.stream, flush=True)

    def line(self, step: int, m: dict[str, Any]) -> str:
        parts = [f"step {step}/{self.total_steps}"]
        if "reward/mean" in m:
            parts.append(f"reward {_number(m['reward/mean'])} ±{_number(m.get('reward/std', 0.0))}")
        parts += [f"{label} {_number(m[key])}" for key, label in _CONSOLE if key in m]
        if "response_length/mean" in m:
            parts.append(f"resp {m['response_length/mean']:.1f} tok")
        if "throughput/tokens_per_s" in m:
            parts.append(f"{m['throughput/tokens_per_s']:.0f} tok/s")
        if "step_seconds" in m:
            parts.append(f"{m['step_seconds']:.1f}s")
            if self._step_seconds and step < self.total_steps:
                recent = self._step_seconds[-5:]
                parts.append(f"ETA {format_duration(sum(recent) / len(recent) * (self.total_steps - step))}")
        return " | ".join(parts)

    def message(self, text: str) -> None:
        if self.console:
            print(text, file=self.stream, flush=True)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
