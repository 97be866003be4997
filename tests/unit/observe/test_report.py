"""`megarl report`: PNGs and report.md from a run directory's files, incomplete runs, comparison of runs."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest

from megarl.cli import main
from megarl.config import config_to_yaml
from megarl.config.schema import MegarlConfig
from megarl.observe.machine import role_layouts
from megarl.observe.plots import AGENT_PLOTS, OFFLINE_PLOTS, PLOT_NAMES
from megarl.observe.report import try_write_report, write_report
from megarl.observe.run_files import read_run, write_run_files
from tests.helpers.run_files import image_stats

pytestmark = pytest.mark.unit

STEPS = 12
EVAL_EVERY = 4
STAGES = {"generate": 3.0, "reward": 0.2, "old_log_prob": 0.8, "ref_log_prob": 0.7, "advantages": 0.05}
UPDATE_ACTOR = 2.0  # seconds of the last stage; each step also spends OTHER outside its stages
OTHER = 0.25
VALIDATE = 1.5
NAN_STEP = 7  # actor/entropy is "nan" there
AGENT_NAMES = {p.name for p in AGENT_PLOTS}
FULL_PLOTS = set(PLOT_NAMES) - set(OFFLINE_PLOTS) - AGENT_NAMES  # a single-turn RL run's


def quickstart_config(tmp: Path) -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.algorithm.name, cfg.algorithm.use_kl_loss = "grpo", True
    cfg.data.train_batch_size, cfg.rollout.n, cfg.data.max_response_length = 16, 8, 32
    cfg.trainer.total_steps, cfg.trainer.eval_every = STEPS, EVAL_EVERY
    cfg.trainer.n_devices_per_node, cfg.trainer.output_dir = 2, str(tmp)
    from megarl.config.validate import resolve_auto

    return resolve_auto(cfg)


def step_record(step: int, scale: float = 1.0) -> dict:
    """One step of a GRPO run as ProgressLog writes it: rewards rising, every key the report reads."""
    t = step / STEPS
    r = {"step": step}
    if step > 0:
        mean = scale * (0.2 + 0.6 * t)
        r.update(
            {
                "reward/mean": mean,
                "reward/std": 0.2 - 0.05 * t,
                "reward/max": 1.0,
                "reward/min": 0.0,
                "response_length/mean": 20 - 8 * t,
                "response_length/max": 32 - 6 * t,
                "actor/kl_loss": 0.001 * step,
                "actor/entropy": "nan" if step == NAN_STEP else 1.5 - 0.5 * t,
                "actor/clip_frac": 0.05 + 0.01 * math.sin(step),
                "actor/grad_norm": 0.8 + 0.3 * math.cos(step),
                "actor/lr": 1e-3,
                "train_rollout_logprob_abs_diff": 1e-6 * (1 + step),
                "train_rollout_logprob_abs_diff_max": 1e-4 * (1 + step),
                **{f"timing/{s}": sec for s, sec in STAGES.items()},
                "timing/update_actor": UPDATE_ACTOR,
            }
        )
        r["step_seconds"] = sum(STAGES.values()) + UPDATE_ACTOR + OTHER
        r["throughput/tokens_per_s"] = 1000.0 + 10 * step
    if step == 0 or step % EVAL_EVERY == 0:
        r["val/reward/mean"] = scale * (0.1 + 0.05 * step) if step != 8 else scale * 0.75  # best at step 8
        r["val/digits/reward/mean"] = r["val/reward/mean"]
        r["timing/validate"] = VALIDATE
    return r


def agent_record(step: int) -> dict:
    """The agent/ metrics of a multi-turn step (megarl.agentic): the tool called more as training goes on."""
    if step == 0:
        return {}
    t = step / STEPS
    return {
        "agent/turns/mean": 1.5 + 0.4 * t,
        "agent/tool_calls/mean": 0.5 + 0.4 * t,
        "agent/tool_errors/malformed": float(4 - step // 4),
        "agent/tool_errors/timeout": float(step % 2),
        "agent/split_samples": float(step % 3),
    }


def write_run(
    run_dir: Path, scale: float = 1.0, finished: bool = True, cut_last_line: bool = False, agent: bool = False
) -> Path:
    """A run directory as RLTrainer leaves it (config.yaml, run_info.json, metrics.jsonl, summary.json)."""
    write_run_files(quickstart_config(run_dir), run_dir)
    records = [step_record(step, scale) | (agent_record(step) if agent else {}) for step in range(STEPS + 1)]
    lines = [json.dumps(r) for r in records]
    text = "\n".join(lines) + "\n"
    if cut_last_line:
        text += lines[-1][: len(lines[-1]) // 2]  # a step being written when the run died
    (run_dir / "metrics.jsonl").write_text(text)
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({"steps": STEPS}))
    return run_dir


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished run reported through the CLI (`megarl report RUN_DIR`); its directory and stdout lines."""
    run_dir = write_run(tmp_path_factory.mktemp("runs") / "grpo_full")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(run_dir)]) == 0
    return run_dir, out.getvalue().splitlines()


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory) -> Path:
    """A run that died in step 4 after 3 steps without actor metrics: no config.yaml, run_info.json or
    summary.json, and a half-written last line."""
    run_dir = tmp_path_factory.mktemp("runs") / "crashed"
    run_dir.mkdir()
    records = [{k: v for k, v in step_record(s).items() if not k.startswith("actor/")} for s in range(5)]
    lines = [json.dumps(r) for r in records]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])
    write_report([run_dir])
    return run_dir


def test_every_plot_of_a_full_run_is_a_distinct_non_blank_png(full_run):
    run_dir, printed = full_run
    pngs = {p.stem: p for p in (run_dir / "report").glob("*.png")}
    assert set(pngs) == FULL_PLOTS - {"value_loss"}  # a GRPO run has no critic
    contents = set()
    for name, png in pngs.items():
        size, colors, std = image_stats(png)
        assert size[0] >= 600 and size[1] >= 300, name
        assert colors > 50 and std > 10, f"{name}.png looks blank: {colors} colours, pixel std {std:.1f}"
        contents.add(png.read_bytes())
    assert len(contents) == len(pngs)
    assert printed == [str(run_dir / "report" / "report.md")] + [f"  {pngs[n]}" for n in sorted(pngs)]


def test_report_states_validation_totals_and_stage_shares(full_run):
    text = (full_run[0] / "report" / "report.md").read_text()
    assert "Incomplete" not in text
    assert "| val/reward/mean | 0.1 (step 0) | 0.7 (step 12) | 0.75 (step 8) |" in text
    wall = STEPS * (sum(STAGES.values()) + UPDATE_ACTOR + OTHER) + 4 * VALIDATE  # steps 0, 4, 8, 12
    assert f"({wall:.1f} s = " in text
    assert f"| samples | {16 * 8 * STEPS:,} (train_batch_size 16 × rollout.n 8 × {STEPS} steps) |" in text
    tokens = sum(1000 + 10 * s for s in range(1, STEPS + 1)) * (sum(STAGES.values()) + UPDATE_ACTOR + OTHER)
    assert f"| tokens | {round(tokens):,} " in text
    shares = dict(re.findall(r"^\| (\w+) \| [\d.]+ \| ([\d.]+)% \|", text, re.M))
    assert set(shares) == set(STAGES) | {"update_actor", "other", "validate"}
    assert sum(map(float, shares.values())) == pytest.approx(100, abs=0.2)
    assert float(shares["generate"]) == pytest.approx(100 * STEPS * STAGES["generate"] / wall, abs=0.05)
    assert "- actor/entropy: steps 7" in text  # the nan is named, not hidden
    for name in FULL_PLOTS - {"value_loss"}:
        assert f"]({name}.png)" in text
    assert "- value_loss: no critic/value_loss in metrics.jsonl" in text
    assert "agent_turns" not in text and "tool_errors" not in text  # a single-turn run: no agent plots named
    assert "## Multi-turn rollouts" not in text
    assert "```yaml\nmodel:" in text and "| actor | tp1xpp1xdp2 | 2 |" in text and "logical CPUs" in text


def test_cut_off_last_line_and_no_summary_are_reported(crashed_run):
    run = read_run(crashed_run)
    assert run.truncated and [h["step"] for h in run.history] == [0, 1, 2, 3] and run.summary is None
    text = (crashed_run / "report" / "report.md").read_text()
    assert "**Incomplete run.**" in text
    assert "last line of metrics.jsonl is cut off" in text and "There is no summary.json" in text
    assert "| training steps | 3 |" in text


def test_a_missing_metric_skips_its_plot_and_names_it(crashed_run):
    pngs = {p.stem for p in (crashed_run / "report").glob("*.png")}
    assert pngs == {"reward", "response_length", "logprob_diff", "throughput", "timing"}
    text = (crashed_run / "report" / "report.md").read_text()
    assert "- entropy: no actor/entropy in metrics.jsonl" in text
    assert "- kl: no kl/mean or actor/kl_loss in metrics.jsonl" in text
    assert "No config.yaml in the run directory" in text and "No run_info.json" in text
    assert "samples | unknown" in text


def test_a_run_that_died_before_its_first_step_still_gets_a_report(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    text = write_report([tmp_path]).read_text()
    assert "metrics.jsonl holds no steps." in text and "No validation scores" in text
    assert not list((tmp_path / "report").glob("*.png"))


def test_compare_overlays_two_runs(full_run, tmp_path):
    run_dir = full_run[0]
    other = write_run(tmp_path / "grpo_low_lr", scale=0.5)
    path = write_report([run_dir, other])
    assert path == run_dir / "report" / "compare" / "compare.md"
    text = path.read_text()
    assert "| `grpo_full` | 12 | 0.1 (step 0) | 0.7 (step 12) | 0.75 (step 8) | 0.8 |" in text
    assert "| `grpo_low_lr` | 12 | 0.05 (step 0) | 0.35 (step 12) | 0.375 (step 8) | 0.4 |" in text
    pngs = {p.stem for p in path.parent.glob("*.png")}
    assert pngs == FULL_PLOTS - {"value_loss"}
    for name in ("reward", "timing"):
        overlay = path.parent / f"{name}.png"
        _, colors, std = image_stats(overlay)
        assert colors > 50 and std > 10
        assert overlay.read_bytes() != (run_dir / "report" / f"{name}.png").read_bytes()


def test_cli_report_rejects_a_dir_without_metrics(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert f"megarl report: error: {tmp_path} has no metrics.jsonl" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err


def test_try_write_report_logs_one_line_instead_of_raising(tmp_path, caplog):
    assert try_write_report(tmp_path / "missing") is None
    assert len(caplog.records) == 1 and "no report for" in caplog.records[0].getMessage()


def test_run_files_hold_the_resolved_config_and_the_layout_per_role(tmp_path):
    cfg = quickstart_config(tmp_path)
    (tmp_path / "summary.json").write_text("{}")  # an earlier run's: this run's verdict is not yet known
    write_run_files(cfg, tmp_path)
    assert (tmp_path / "config.yaml").read_text() == config_to_yaml(cfg)
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert set(info["layout"]) == {"actor", "ref", "rollout"}  # GRPO with a KL loss: no critic, no RM
    assert info["layout"] == role_layouts(cfg) and info["layout"]["actor"]["dp"] == 2
    assert info["machine"]["logical_cpus"] >= 1 and "torch" in info["machine"]["versions"]
    assert not (tmp_path / "summary.json").exists()


def test_a_multi_turn_run_gets_turn_tool_and_split_plots_and_a_section(tmp_path):
    """Only the agent/ metrics are logged (the other plots are the full run's tests): cheap to draw."""
    run_dir = tmp_path / "agentic"
    run_dir.mkdir()
    lines = [json.dumps({"step": s} | agent_record(s)) for s in range(STEPS + 1)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    text = write_report([run_dir]).read_text()
    pngs = {p.stem: p for p in (run_dir / "report").glob("*.png")}
    assert set(pngs) == AGENT_NAMES
    for name in AGENT_NAMES:
        size, colors, std = image_stats(pngs[name])
        assert colors > 50 and std > 10, f"{name}.png looks blank"
        assert f"]({name}.png)" in text
    assert "## Multi-turn rollouts" in text
    assert "| agent/turns/mean | 1.533 (step 1) | 1.9 (step 12) | 1.717 |" in text
    assert "| agent/tool_calls/mean | 0.5333 (step 1) | 0.9 (step 12) | 0.7167 |" in text
    assert "| agent/tool_errors/malformed | 4 (step 1) | 1 (step 12) | 2.75 |" in text
    assert "| agent/split_samples | 1 (step 1) | 0 (step 12) | 1 |" in text
    other = tmp_path / "single_turn"
    other.mkdir()
    (other / "metrics.jsonl").write_text(json.dumps({"step": 1, "agent/turns/mean": 1.0}) + "\n")
    path = write_report([run_dir, other])  # the comparison draws what either run logged
    assert {p.stem for p in path.parent.glob("*.png")} == AGENT_NAMES
