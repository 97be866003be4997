"""TensorBoard and wandb get every step under the metrics.jsonl names, read back from their own files."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from megarl.config.schema import MegarlConfig
from megarl.observe.backends import JsonlSink
from megarl.observe.progress import ProgressLog
from tests.helpers.run_files import assert_same_as_jsonl, jsonl_history, tensorboard_history, wandb_history

pytestmark = pytest.mark.unit

BACKENDS = ["console", "jsonl", "tensorboard", "wandb"]


def fake_steps() -> list[dict]:
    """Five steps of what a trainer logs: ints, floats, a tensor, NaN and inf, validation at 2 and 5."""
    import torch

    steps = []
    for step in range(1, 6):
        m = {
            "reward/mean": 0.1 * step,
            "reward/std": 0.25,
            "response_length/max": 10 + step,  # an int
            "data/epoch": 0,
            "actor/grad_norm": torch.tensor(1.5 * step),
            "timing/generate": 2.0 + step,
            "timing/update_actor": 1.0,
            "step_seconds": 3.0 + step,
            "throughput/tokens_per_s": 1234.5,
        }
        if step == 3:
            m["actor/grad_norm"] = float("nan")
        if step == 4:
            m["kl/mean"] = float("inf")
        if step in (2, 5):
            m["val/reward/mean"] = 0.5 + 0.01 * step
            m["val/digits/reward/mean"] = 0.25
        steps.append(m)
    return steps


def run_config(out_dir: Path, backends: list[str] = BACKENDS) -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.trainer.output_dir = str(out_dir)
    cfg.logging.backends = backends
    cfg.logging.project = "megarl-test"
    cfg.logging.run_name = "fake-run"
    return cfg


def log_run(cfg: MegarlConfig, steps: list[dict]) -> str:
    out = io.StringIO()
    log = ProgressLog.for_run(cfg, total_steps=len(steps), writer=True, stream=out)
    for step, metrics in enumerate(steps, start=1):
        log.log(step, metrics)
    log.close()
    return out.getvalue()


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory) -> tuple[Path, str]:
    """One fake 5-step run through every backend, wandb under WANDB_MODE=offline: (output_dir, console)."""
    out_dir = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        console = log_run(run_config(out_dir), fake_steps())
    return out_dir, console


def test_jsonl_keeps_its_format(offline_run):
    out_dir, _ = offline_run
    jsonl = jsonl_history(out_dir)
    assert sorted(jsonl) == [1, 2, 3, 4, 5]
    assert jsonl[1]["response_length/max"] == 11 and isinstance(jsonl[1]["response_length/max"], int)
    assert jsonl[3]["actor/grad_norm"] == "nan" and jsonl[4]["kl/mean"] == "inf"
    assert jsonl[2]["val/reward/mean"] == pytest.approx(0.52) and "val/reward/mean" not in jsonl[3]


def test_tensorboard_scalars_equal_metrics_jsonl(offline_run):
    out_dir, _ = offline_run
    assert list((out_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert_same_as_jsonl(tensorboard_history(out_dir / "tensorboard"), jsonl_history(out_dir), rel=1e-6)


def test_wandb_offline_history_equals_metrics_jsonl(offline_run):
    out_dir, console = offline_run
    assert "wandb" not in console  # offline because WANDB_MODE says so: nothing to warn about
    assert list(out_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert_same_as_jsonl(wandb_history(out_dir), jsonl_history(out_dir), rel=1e-12)


def test_console_prints_one_line_per_step_when_not_a_terminal(offline_run):
    _, console = offline_run
    lines = console.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [f"step {s}/5" for s in range(1, 6)]
    assert (
        lines[1] == "step 2/5 | reward 0.200 ±0.250 | val 0.520 | 1234 tok/s | 5.0s | ETA 14s"
    )  # (4 + 5) / 2 s × 3 steps
    assert " | kl inf | " in lines[3] and lines[4].endswith(" | 8.0s")


def test_wandb_init_failure_falls_back_to_offline_once(tmp_path, monkeypatch):
    import wandb

    real_init, calls = wandb.init, []

    def init_failing_once(**kwargs):
        calls.append(kwargs.get("mode"))
        if len(calls) == 1:
            raise wandb.errors.CommError("Post http://127.0.0.1:9/graphql: connection refused")
        return real_init(**kwargs)

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(wandb, "login", lambda **kwargs: True)
    monkeypatch.setattr(wandb, "init", init_failing_once)
    steps = fake_steps()[:2]
    console = log_run(run_config(tmp_path, ["console", "wandb"]), steps)
    assert calls == [None, "offline"]
    warnings = [line for line in console.splitlines() if "wandb" in line]
    (run_dir,) = tmp_path.glob("wandb/offline-run-*")
    assert warnings == [
        "megarl: wandb is offline (CommError: Post http://127.0.0.1:9/graphql: connection refused); "
        f"the run is saved in {run_dir}; upload it with `wandb sync {run_dir}`"
    ]
    assert_same_as_jsonl(wandb_history(tmp_path), jsonl_history(tmp_path), rel=1e-12)


class FakeRun:
    def __init__(self, directory: Path) -> None:
        self.dir, self.logged, self.finished = str(directory / "files"), [], False

    def log(self, metrics, step):
        self.logged.append((step, metrics))

    def finish(self):
        self.finished = True


def test_not_logged_in_goes_offline_without_trying_online(tmp_path, monkeypatch):
    import wandb

    calls = []

    def fake_init(**kwargs):
        calls.append(kwargs)
        calls[-1]["run"] = FakeRun(tmp_path / "wandb" / "offline-run-x")
        return calls[-1]["run"]

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(wandb, "login", lambda **kwargs: False)
    monkeypatch.setattr(wandb, "init", fake_init)
    console = log_run(run_config(tmp_path, ["wandb"]), [{"reward/mean": 1.0}, {"reward/mean": float("nan")}])
    (call,) = calls
    assert call["mode"] == "offline" and call["project"] == "megarl-test" and call["name"] == "fake-run"
    assert call["dir"] == str(tmp_path) and call["config"]["trainer"]["output_dir"] == str(tmp_path)
    assert console.count("\n") == 1 and "wandb is offline (not logged in: set WANDB_API_KEY" in console
    run = call["run"]
    assert (
        run.finished and [s for s, _ in run.logged] == [1, 2] and math.isnan(run.logged[1][1]["reward/mean"])
    )


def test_wandb_that_cannot_start_at_all_leaves_the_other_sinks_running(tmp_path, monkeypatch):
    import wandb

    def broken_init(**kwargs):
        raise OSError("read-only file system")

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(wandb, "init", broken_init)
    console = log_run(run_config(tmp_path, ["wandb"]), [{"reward/mean": 1.0}])
    assert console == "megarl: wandb could not start (OSError: read-only file system); logging without it\n"
    assert jsonl_history(tmp_path) == {1: {"reward/mean": 1.0}}


def test_a_resumed_run_keeps_metrics_up_to_its_checkpoint_and_drops_the_rest(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = JsonlSink(path)
    for step in range(5):
        first.log(step, {"reward/mean": float(step), "actor/grad_norm": float("nan")})
    with open(path, "a") as f:
        f.write('{"step": 5, "rew')  # the run died mid-line
    resumed = JsonlSink(path, resume_step=2)
    resumed.log(3, {"reward/mean": 30.0})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[1] == {"step": 1, "reward/mean": 1.0, "actor/grad_norm": "nan"}
    assert records[3]["reward/mean"] == 30.0
