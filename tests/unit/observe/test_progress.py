"""The per-step console line and metrics.jsonl."""

from __future__ import annotations

import io
import json

from megarl.observe.progress import ProgressLog, format_duration


def test_console_line_and_jsonl_record_every_step(tmp_path):
    out = io.StringIO()
    log = ProgressLog(tmp_path, total_steps=4, backends=["console", "jsonl"], stream=out)
    metrics = {
        "reward/mean": 0.5,
        "reward/std": 0.25,
        "val/reward/mean": 0.75,
        "actor/kl_loss": 0.0012,
        "actor/entropy": 1.5,
        "response_length/mean": 6.25,
        "throughput/tokens_per_s": 321.4,
        "step_seconds": 10.0,
    }
    log.log(1, metrics)
    log.log(2, {**metrics, "step_seconds": 20.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "step 1/4 | reward 0.500 ±0.250 | val 0.750 | kl_loss 0.0012 | entropy 1.500 | resp 6.2 tok | "
        "321 tok/s | 10.0s | ETA 30s"
    )
    assert lines[1].endswith("20.0s | ETA 30s")  # mean of the recent steps (15 s) × 2 steps left
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and records[0]["reward/mean"] == 0.5


def test_no_console_backend_prints_nothing_and_durations_read_naturally(tmp_path):
    out = io.StringIO()
    (tmp_path / "metrics.jsonl").write_text('{"step": 7}\n')  # an earlier run's: a new run starts afresh
    ProgressLog(tmp_path, 2, [], stream=out).log(1, {"reward/mean": 1.0})
    assert out.getvalue() == ""
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 1.0}\n'
    ProgressLog(tmp_path / "rank1", 2, ["console"], stream=out, writer=False).log(1, {"reward/mean": 1.0})
    assert out.getvalue() == "" and not (tmp_path / "rank1").exists()
    assert (format_duration(5), format_duration(75), format_duration(7300)) == ("5s", "1m15s", "2h01m")
