"""Where a run's step metrics go besides the console: metrics.jsonl (always), TensorBoard and wandb.

    sinks = [JsonlSink(out_dir / "metrics.jsonl"), *open_sinks(cfg, say=print)]  # + TensorBoard, wandb
    for sink in sinks:
        sink.log(3, {"reward/mean": 0.41, "timing/generate": 5.1})
    for sink in sinks:
        sink.close()

`megarl.observe.progress.ProgressLog` does this for the trainers.

Every sink gets the same names (the metrics.jsonl keys) and the same step. A non-finite value stays
non-finite everywhere: NaN/±inf in TensorBoard and wandb, the string "nan"/"inf"/"-inf" in metrics.jsonl
(JSON has no NaN). Only the writing process (the driver, or rank 0 under torchrun) opens sinks.

Under `trainer.output_dir`:

    metrics.jsonl                        one JSON object per step, {"step": N, ...}
    tensorboard/events.out.tfevents.*    one scalar per metric, global_step = step
    wandb/offline-run-*/ or wandb/run-*/ wandb's run directory (`wandb sync DIR` uploads an offline one)

wandb never stops a run: when it is not logged in or cannot reach its server it logs offline and says
so once; if even that fails, the other sinks carry on.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Protocol

from megarl.atomic_write import write_text_atomically

# How long wandb may try to reach its server before megarl logs offline (WANDB_INIT_TIMEOUT overrides).
WANDB_INIT_TIMEOUT_S = 30.0


class MetricsSink(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record one step's metrics (plain Python numbers, keyed by their metrics.jsonl names)."""
        ...

    def close(self) -> None:
        """Flush and release; called once at the end of the run (or when it fails)."""
        ...


def numbers(metrics: dict[str, Any]) -> dict[str, float | int]:
    """The numeric metrics (bools as 0/1); what TensorBoard and wandb can plot."""
    return {k: int(v) if isinstance(v, bool) else v for k, v in metrics.items() if isinstance(v, int | float)}


class JsonlSink:
    """`metrics.jsonl`: one JSON object per step, appended and flushed at once so a run that dies keeps
    every finished step. A new run starts the file afresh; a run resumed from step N keeps the records
    of steps 0..N and drops later ones (they belong to the run that died after its checkpoint)."""

    def __init__(self, path: str | Path, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step is not None and self.path.is_file():
            for line in self.path.read_text().splitlines():
                step = _step_of(line)
                if step is not None and step <= resume_step:
                    kept.append(line + "\n")
        write_text_atomically(self.path, "".join(kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _json_value(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        pass


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:  # the cut-off last line of a run that died
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None


class TensorBoardSink:
    """Scalars under `<output_dir>/tensorboard/`, each named as in metrics.jsonl, at global_step = step.
    A run resumed from step N purges the earlier run's events after step N."""

    def __init__(self, log_dir: str | Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        wall_time = time.time()
        for name, value in numbers(metrics).items():
            self.writer.add_scalar(name, value, global_step=step, walltime=wall_time)
        self.writer.flush()  # a step takes seconds: flushing each one keeps a crashed run's curves

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A wandb run (online, or offline when that is all that works); `close()` finishes it and waits
    until wandb has written it."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(numbers(metrics), step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # finish can return before wandb's service wrote the run's file; this waits

    @classmethod
    def open(
        cls, output_dir: str | Path, project: str, name: str, config: dict, say: Callable[[str], None]
    ) -> WandbSink | None:
        """Start the run in `<output_dir>/wandb/`, online unless WANDB_MODE says otherwise; when not
        logged in or wandb.init fails, offline, saying why once. None (after saying so) when even the
        offline run cannot start."""
        import wandb

        wandb.setup(settings=wandb.Settings(silent=True))  # megarl's console view speaks for wandb
        options = {"silent": True, "console": "off"}  # wandb's console capture would break the live view
        if "WANDB_INIT_TIMEOUT" not in os.environ:
            options["init_timeout"] = WANDB_INIT_TIMEOUT_S
        kwargs = {"project": project, "name": name, "dir": str(output_dir), "config": config}
        kwargs["settings"] = wandb.Settings(**options)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        why = None  # why the run is offline although WANDB_MODE did not ask for it
        if os.environ.get("WANDB_MODE", "online") in ("online", "run"):
            why = _not_logged_in(wandb)
            if why is None:
                try:
                    return cls(wandb.init(**kwargs))
                except Exception as e:  # no network, server down, bad key, init timeout
                    why = _reason(e)
            kwargs["mode"] = "offline"
        try:
            run = wandb.init(**kwargs)
        except Exception as e:
            say(f"megarl: wandb could not start ({_reason(e)}); logging without it")
            return None
        if why is not None:
            run_dir = Path(run.dir).parent
            say(
                f"megarl: wandb is offline ({why}); the run is saved in {run_dir}; upload it with `wandb sync {run_dir}`"
            )
        return cls(run)


def open_sinks(cfg: Any, say: Callable[[str], None], resume_step: int | None = None) -> list[MetricsSink]:
    """The TensorBoard and wandb sinks `cfg.logging.backends` (of a MegarlConfig) asks for, under
    `cfg.trainer.output_dir` ("console" and "jsonl" need none: metrics.jsonl is always written). A
    resumed run's wandb run is a new run (offline runs cannot be resumed)."""
    out_dir = Path(cfg.trainer.output_dir)
    lg = cfg.logging
    sinks: list[MetricsSink] = []
    if "tensorboard" in lg.backends:
        sinks.append(TensorBoardSink(out_dir / "tensorboard", resume_step))
    if "wandb" in lg.backends:
        config = asdict(cfg) if is_dataclass(cfg) else dict(cfg)
        wandb_sink = WandbSink.open(out_dir, lg.project, lg.run_name or auto_run_name(cfg), config, say)
        if wandb_sink is not None:
            sinks.append(wandb_sink)
    return sinks


def auto_run_name(cfg: Any) -> str:
    """`<algorithm>-<model directory>-<start time>`, e.g. grpo-Qwen2.5-0.5B-20250301-142233."""
    model = Path(cfg.model.path or "model").name or "model"
    return f"{cfg.algorithm.name}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"


def _not_logged_in(wandb: Any) -> str | None:
    """Why wandb cannot log online without asking for a key (None: it has one); never prompts."""
    try:
        if wandb.login(prompt=False, verify=False):
            return None
    except Exception as e:  # a malformed key
        return _reason(e)
    return "not logged in: set WANDB_API_KEY or run `wandb login`"


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
