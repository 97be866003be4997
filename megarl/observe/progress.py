"""Step metrics to where a person reads them: the console, metrics.jsonl and the logging backends.

    log = ProgressLog.for_run(cfg, total_steps, writer=True)   # opens TensorBoard / wandb per logging.backends
    with log.task("starting the worker groups"):               # long work that is not a step
        ...
    log.log(step, metrics)                                     # every sink, and the console
    log.close()                                                # flush every sink (wandb.finish)

In a terminal the console is a live view: the step bar with ETA, the last step's reward, validation
score, KL and tokens/s, and where the step's time went (its `timing/<stage>` seconds). Anywhere else
(CI, SLURM logs, a pipe) it is one plain line per step:

    step 3/10 | reward 0.412 ±0.31 | val 0.500 | kl 0.0012 | entropy 1.23 | resp 7.1 tok | 1234 tok/s | 12.3s | ETA 1m26s

(`reward errors 3` after the reward when rows' reward functions failed.) The console shows every `logging.log_every`-th step (and the first, the last and validation steps) as
such a line, in a terminal above the live view; a task ends with one line, `starting the worker groups
… done in 8.1 s`. `<output_dir>/metrics.jsonl` (always) and the TensorBoard / wandb backends get every
step under the same names (see `megarl.observe.backends`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from megarl.observe.backends import JsonlSink, MetricsSink, open_sinks
from megarl.observe.worker_logs import console


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
    ("pref/loss", "loss"),
    ("rm/loss", "loss"),
    ("rewards/accuracy", "acc"),
    ("rm/accuracy", "acc"),
    ("rewards/margin", "margin"),
    ("val/rewards/accuracy", "val acc"),
    ("val/rm/accuracy", "val acc"),
    ("val/reward/mean", "val"),
    ("kl/mean", "kl"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/entropy", "entropy"),
    ("critic/value_loss", "vf_loss"),
)


class ProgressLog:
    """Writes each step's metrics to the console, `<output_dir>/metrics.jsonl` and `sinks`."""

    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        backends: list[str],
        stream: TextIO | None = None,
        every: int = 1,
        writer: bool = True,
        sinks: list[MetricsSink] | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.total_steps = total_steps
        self.every = every
        self.writer = writer
        self.console = writer and "console" in backends
        self.stream = stream
        # metrics.jsonl is always written (by the one writing process); a new run starts it afresh, a
        # resumed one keeps the steps up to its checkpoint
        self.path = Path(output_dir) / "metrics.jsonl" if writer else None
        self.sinks: list[MetricsSink] = [JsonlSink(self.path, resume_step), *(sinks or [])] if writer else []
        self._step_seconds: list[float] = []
        self._live = (
            LiveView(self._stream(), total_steps) if self.console and _is_terminal(self._stream()) else None
        )

    @classmethod
    def for_run(
        cls,
        cfg: Any,
        total_steps: int,
        writer: bool,
        stream: TextIO | None = None,
        resume_step: int | None = None,
    ) -> ProgressLog:
        """The log of a run of `cfg` (a MegarlConfig): trainer.output_dir, logging.* (backends,
        project, run_name, log_every). Only the writer opens the TensorBoard / wandb sinks. A run
        resumed from `resume_step` keeps the metrics of the steps up to it."""
        log = cls(
            cfg.trainer.output_dir,
            total_steps,
            cfg.logging.backends,
            stream=stream,
            every=cfg.logging.log_every,
            writer=writer,
            resume_step=resume_step,
        )
        if writer:
            log.sinks += open_sinks(cfg, say=log.warn, resume_step=resume_step)
        return log

    def retarget(self, total_steps: int) -> None:
        """Count to `total_steps` from now on (a trainer's `fit` to another last step)."""
        self.total_steps = total_steps
        if self._live is not None:
            self._live.total_steps = total_steps

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = {k: _item(v) for k, v in sorted(metrics.items())}
        for sink in list(self.sinks):
            if isinstance(sink, JsonlSink):
                sink.log(step, values)  # the run's record: a failure here must stop the run
                continue
            try:
                sink.log(step, values)
            except Exception as e:  # a plotting backend must not end a training run
                self.sinks.remove(sink)
                self.warn(
                    f"megarl: {type(sink).__name__} failed ({type(e).__name__}: {e}); it gets no more metrics"
                )
        if "step_seconds" in values:
            self._step_seconds.append(float(values["step_seconds"]))
        if not self.console:
            return
        if step % self.every == 0 or step in (1, self.total_steps) or "val/reward/mean" in values:
            self._say(self.line(step, values))
        if self._live is not None:
            self._live.update(step, values, self.eta(step))

    def line(self, step: int, m: dict[str, Any]) -> str:
        parts = [f"step {step}/{self.total_steps}"]
        if "reward/mean" in m:
            parts.append(f"reward {_number(m['reward/mean'])} ±{_number(m.get('reward/std', 0.0))}")
        if m.get("reward/errors"):  # rows whose reward function failed (scored 0)
            parts.append(f"reward errors {m['reward/errors']:.0f}")
        parts += [f"{label} {_number(m[key])}" for key, label in _CONSOLE if key in m]
        if "response_length/mean" in m:
            parts.append(f"resp {m['response_length/mean']:.1f} tok")
        if "agent/turns/mean" in m:  # multi-turn rollouts (megarl.agentic)
            parts.append(f"turns {m['agent/turns/mean']:.2f}")
        if "agent/tool_calls/mean" in m:
            parts.append(f"tools {m['agent/tool_calls/mean']:.2f}")
        if "throughput/tokens_per_s" in m:
            parts.append(f"{m['throughput/tokens_per_s']:.0f} tok/s")
        if "step_seconds" in m:
            parts.append(f"{m['step_seconds']:.1f}s")
            eta = self.eta(step)
            if eta is not None:
                parts.append(f"ETA {format_duration(eta)}")
        return " | ".join(parts)

    def eta(self, step: int) -> float | None:
        """Seconds left: the mean of the last five steps × the steps left; None when unknown or done."""
        if not self._step_seconds or step >= self.total_steps:
            return None
        recent = self._step_seconds[-5:]
        return sum(recent) / len(recent) * (self.total_steps - step)

    @contextmanager
    def task(self, text: str) -> Iterator[None]:
        """Long work that is not a step: a spinner in the live view; then one line, `text … done in 8.1 s`
        (or `… failed after 3.0 s`)."""
        if not self.console:
            yield
            return
        start = time.perf_counter()
        if self._live is not None:
            self._live.begin(text)
        try:
            yield
        except BaseException:
            self._say(f"{text} … failed after {time.perf_counter() - start:.1f} s")
            raise
        finally:
            if self._live is not None:
                self._live.end()
        self._say(f"{text} … done in {time.perf_counter() - start:.1f} s")

    def message(self, text: str) -> None:
        if self.console:
            self._say(text)

    def warn(self, text: str) -> None:
        """A message the writer shows even without the console backend (a backend went offline)."""
        if self.writer:
            self._say(text)

    def close(self) -> None:
        """Flush and close every sink (wandb.finish) and stop the live view; idempotent, never raises."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception as e:  # must not hide the error that ended the run
                self._say(f"megarl: closing {type(sink).__name__} failed: {type(e).__name__}: {e}")
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _stream(self) -> TextIO:
        return self.stream if self.stream is not None else console()

    def _say(self, text: str) -> None:
        if self._live is not None:
            self._live.print(text)
        else:
            print(text, file=self._stream(), flush=True)


@contextmanager
def task(text: str, stream: TextIO | None = None) -> Iterator[None]:
    """`ProgressLog.task` without a run: a spinner in a terminal, then `text … done in 0.4 s`."""
    stream = stream if stream is not None else console()
    start = time.perf_counter()
    status = None
    if _is_terminal(stream):
        from rich.console import Console

        status = Console(file=stream).status(text)
        status.start()
    try:
        yield
    except BaseException:
        outcome = f"failed after {time.perf_counter() - start:.1f} s"
        raise
    else:
        outcome = f"done in {time.perf_counter() - start:.1f} s"
    finally:
        if status is not None:
            status.stop()
        print(f"{text} … {outcome}", file=stream, flush=True)


class LiveView:
    """The terminal view (rich): the running task, the step bar with ETA, the last step's headline
    numbers and its per-stage time breakdown. Started by the first step or task, redrawn in place."""

    def __init__(self, stream: TextIO, total_steps: int) -> None:
        from rich.console import Console

        self.console = Console(file=stream)
        self.total_steps = total_steps
        self.step, self.metrics, self.eta = 0, {}, None
        self.val: tuple[int, float] | None = None  # (step, val/reward/mean) of the last validation
        self.tasks: list[Any] = []  # spinners of the running tasks, innermost last
        self.started = time.monotonic()
        self._live = None

    def update(self, step: int, metrics: dict[str, Any], eta: float | None) -> None:
        self.step, self.metrics, self.eta = step, metrics, eta
        if "val/reward/mean" in metrics:
            self.val = (step, metrics["val/reward/mean"])
        self._refresh()

    def begin(self, text: str) -> None:
        from rich.spinner import Spinner

        self.tasks.append(Spinner("dots", text))
        self._refresh()

    def end(self) -> None:
        self.tasks.pop()
        self._refresh()

    def print(self, text: str) -> None:
        self._start()
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _start(self) -> None:
        if self._live is None:
            from rich.live import Live

            self._live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4)
            self._live.start()

    def _refresh(self) -> None:
        self._start()
        self._live.refresh()

    def render(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        rows: list[Any] = list(self.tasks)
        if self.step or not self.tasks:
            bar = Table.grid(padding=(0, 1))
            bar.add_row(
                f"step {self.step}/{self.total_steps}",
                ProgressBar(total=max(self.total_steps, 1), completed=self.step, width=40),
                f"{self.step / max(self.total_steps, 1):4.0%}",
                f"elapsed {format_duration(time.monotonic() - self.started)}",
                f"ETA {format_duration(self.eta)}" if self.eta is not None else "",
            )
            rows.append(bar)
        headline = self._headline()
        if headline:
            rows.append(headline)
        stages = self._stages()
        if stages is not None:
            rows.append(stages)
        return Group(*rows)

    def _headline(self) -> str:
        m = self.metrics
        parts = []
        if "reward/mean" in m:
            parts.append(f"reward {_number(m['reward/mean'])} ±{_number(m.get('reward/std', 0.0))}")
        if m.get("reward/errors"):
            parts.append(f"reward errors {m['reward/errors']:.0f}")
        for key in ("sft/loss", "pref/loss", "rm/loss"):
            if key in m:
                parts.append(f"loss {_number(m[key])}")
        if self.val is not None:
            parts.append(f"val {_number(self.val[1])} (step {self.val[0]})")
        kl = m.get("kl/mean", m.get("actor/kl_loss"))
        if kl is not None:
            parts.append(f"kl {_number(kl)}")
        if "throughput/tokens_per_s" in m:
            parts.append(f"{m['throughput/tokens_per_s']:.0f} tok/s")
        if "step_seconds" in m:
            parts.append(f"{m['step_seconds']:.1f} s/step")
        return " · ".join(parts)

    def _stages(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        stages = {k.removeprefix("timing/"): v for k, v in self.metrics.items() if k.startswith("timing/")}
        if not stages:
            return None
        total = self.metrics.get("step_seconds") or sum(stages.values()) or 1.0
        table = Table(box=None, padding=(0, 1), show_edge=False)
        for column in ("stage", "seconds", "share", ""):
            table.add_column(column, justify="right" if column == "seconds" else "left")
        for name, seconds in stages.items():
            share = seconds / total
            table.add_row(
                name,
                f"{seconds:.2f}",
                ProgressBar(total=1.0, completed=min(share, 1.0), width=20),
                f"{share:.0%}",
            )
        return table


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _item(value: Any) -> Any:
    """A tensor / numpy scalar as a Python number."""
    return value.item() if hasattr(value, "item") else value
