"""The per-step console line and metrics.jsonl."""

from __future__ import annotations

import io
import json
import re

import pytest

from megarl.observe.progress import ProgressLog, format_duration, task


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


def test_a_multi_turn_step_shows_turns_and_tool_calls(tmp_path):
    log = ProgressLog(tmp_path, total_steps=4, backends=["console"], stream=io.StringIO())
    metrics = {"reward/mean": 0.5, "response_length/mean": 40.0, "agent/turns/mean": 1.75}
    assert log.line(1, {**metrics, "agent/tool_calls/mean": 0.8125}) == (
        "step 1/4 | reward 0.500 ±0 | resp 40.0 tok | turns 1.75 | tools 0.81"
    )


def test_no_console_backend_prints_nothing_and_durations_read_naturally(tmp_path):
    out = io.StringIO()
    (tmp_path / "metrics.jsonl").write_text('{"step": 7}\n')  # an earlier run's: a new run starts afresh
    ProgressLog(tmp_path, 2, [], stream=out).log(1, {"reward/mean": 1.0})
    assert out.getvalue() == ""
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 1.0}\n'
    ProgressLog(tmp_path / "rank1", 2, ["console"], stream=out, writer=False).log(1, {"reward/mean": 1.0})
    assert out.getvalue() == "" and not (tmp_path / "rank1").exists()
    assert (format_duration(5), format_duration(75), format_duration(7300)) == ("5s", "1m15s", "2h01m")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tasks_end_with_one_plain_line_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    log = ProgressLog(tmp_path, 2, ["console"], stream=out)
    with log.task("starting the worker groups (actor, ref)"):
        pass
    with pytest.raises(RuntimeError), log.task("loading the model"):
        raise RuntimeError("no such file")
    with task("making digits_sort", stream=out):
        pass
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"starting the worker groups \(actor, ref\) … done in \d+\.\d s", lines[0])
    assert re.fullmatch(r"loading the model … failed after \d+\.\d s", lines[1])
    assert re.fullmatch(r"making digits_sort … done in \d+\.\d s", lines[2]) and len(lines) == 3


def test_terminal_gets_the_live_view_with_the_stage_breakdown(tmp_path):
    out = Terminal()
    log = ProgressLog(tmp_path, 3, ["console"], stream=out)
    with log.task("starting the worker groups (actor)"):
        pass
    metrics = {
        "reward/mean": 0.5,
        "val/reward/mean": 0.75,
        "kl/mean": 0.002,
        "throughput/tokens_per_s": 321.0,
        "timing/generate": 6.0,
        "timing/update_actor": 2.0,
        "step_seconds": 8.0,
    }
    log.log(1, metrics)
    log.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # without the cursor/colour codes
    assert "starting the worker groups (actor) … done in" in text
    assert "step 1/3 | reward 0.500 ±0 | val 0.750 | kl 0.002 | 321 tok/s | 8.0s | ETA 16s" in text
    assert "reward 0.500 ±0 · val 0.750 (step 1) · kl 0.002 · 321 tok/s · 8.0 s/step" in text
    assert re.search(r"generate\s+6\.00 .*75%", text) and re.search(r"update_actor\s+2\.00 .*25%", text)
    assert re.search(r"step 1/3 .*33%.*ETA 16s", text)


def test_a_failing_backend_is_dropped_with_one_warning_and_jsonl_goes_on(tmp_path):
    class Broken:
        closed = False

        def log(self, step, metrics):
            raise OSError("disk full")

        def close(self):
            Broken.closed = True

    out = io.StringIO()
    log = ProgressLog(tmp_path, 2, [], stream=out, sinks=[Broken()])
    log.log(1, {"reward/mean": 1.0})
    log.log(2, {"reward/mean": 2.0})
    log.close()
    assert out.getvalue() == "megarl: Broken failed (OSError: disk full); it gets no more metrics\n"
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2 and not Broken.closed
