"""Reward functions run contained: a hang, sys.exit, os._exit, a segfault or a result that is no score
fails its row only (counted, the first failure logged), and too many failures stop the run with the cause."""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import pytest

from megarl.config.schema import RewardFunctionConfig, RewardModelConfig
from megarl.rewards import RewardComputer, RewardFunctionError
from megarl.rewards.calls import Failed, Scored
from megarl.rewards.pool import FunctionSpec, RewardPool
from tests.unit.rewards.test_computer import reward_file, rollout

pytestmark = pytest.mark.unit

TIMEOUT_S = 0.5

# One function that misbehaves in every way a reward function can, chosen by the response's text.
MISBEHAVING = """
import ctypes, os, sys, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    kind = solution_str
    if kind == "sleep":
        time.sleep(60)
    if kind == "c_loop":  # C code that never returns to the interpreter: SIGALRM cannot interrupt it
        return float(sum(range(10**13)))
    if kind == "exit":
        sys.exit(3)
    if kind == "os_exit":
        os._exit(1)
    if kind == "segfault":
        ctypes.string_at(0)
    if kind == "none":
        return None
    if kind == "nan":
        return float("nan")
    if kind == "str":
        return "1.0"
    if kind == "raise":
        raise ValueError("cannot parse " + kind)
    return 1.0
"""

EXPECTED = {
    "sleep": f"timed out after {TIMEOUT_S:g}s",
    "c_loop": f"timed out after {TIMEOUT_S:g}s",
    "exit": "the reward function called sys.exit(3)",
    "os_exit": "the reward process exited with code 1 (os._exit, or a library ending the process)",
    "segfault": "the reward process died with signal 11 (SIGSEGV)",
    "none": "TypeError: the reward function returned None; expected a number or a dict with a 'score'",
    "nan": "ValueError: the reward function returned nan; a score must be finite",
    "str": "TypeError: the reward function returned a str ('1.0'); expected a number or a dict with a 'score'",
    "raise": "ValueError: cannot parse raise",
}


@pytest.fixture
def misbehaving(tmp_path) -> str:
    return reward_file(tmp_path, MISBEHAVING, "misbehaving.py")


def _calls(kinds: list[str]) -> list[dict]:
    return [{"data_source": "s", "solution_str": k, "ground_truth": "x", "extra_info": None} for k in kinds]


def test_every_failure_fails_its_row_only_and_lost_workers_are_replaced(misbehaving):
    pool = RewardPool(FunctionSpec.file(misbehaving, "compute_score"), 2, TIMEOUT_S, "misbehaving")
    kinds = ["ok", *EXPECTED, "ok", "ok"]
    try:
        outcomes = pool.run(_calls(kinds))
        assert [o.summary if isinstance(o, Failed) else o for o in outcomes] == [
            EXPECTED.get(k, Scored(1.0, {})) for k in kinds
        ]
        sleep = outcomes[kinds.index("sleep")]  # interrupted in Python: where it was is shown
        assert isinstance(sleep, Failed) and 'misbehaving.py", line 7, in compute_score' in sleep.detail
        assert pool.started_workers == 2 + 3  # the C loop, os._exit and the segfault each cost a worker
        assert pool.run(_calls(["ok"] * 64)) == [Scored(1.0, {})] * 64  # the replacements score
        pids = [w.proc.pid for w in pool.workers]
    finally:
        pool.close()
    assert pool.workers == [] and not any(_alive(pid) for pid in pids)


def test_the_computer_counts_failed_rows_and_stops_past_max_error_fraction(misbehaving, tokenizer, caplog):
    cfg = RewardModelConfig(function=RewardFunctionConfig(path=misbehaving), timeout_s=TIMEOUT_S, workers=2)
    computer = RewardComputer(cfg, tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="megarl.rewards"):
            scores, metrics = computer.score(
                rollout(tokenizer, ["ok", "exit", "segfault", "ok"], ["s"] * 4, ["x"] * 4)
            )
        assert scores.tolist() == [1.0, 0.0, 0.0, 1.0] and metrics["reward/errors"] == 2  # 2 of 4: allowed
        (first,) = caplog.records
        assert first.getMessage().startswith(
            f"reward function compute_score from {misbehaving} failed on batch row 1, dataset row 11 "
            "(data_source 's'): the reward function called sys.exit(3); that row scores 0 and counts in "
            "reward/errors (later failures are only counted).\nTraceback (most recent call last):\n"
        )
        with pytest.raises(RewardFunctionError) as info:
            computer.score(rollout(tokenizer, ["ok", "none", "nan", "os_exit"], ["s"] * 4, ["x"] * 4))
        assert info.value.exit_code == 1
        assert str(info.value) == (
            f"reward function compute_score from {misbehaving} failed on 3 of 4 rows of this step "
            "(reward.max_error_fraction=0.5 allows 2); the first, batch row 1, dataset row 11 (data_source "
            f"'s'): {EXPECTED['none']}. Fix the function (its first failure is logged above with the traceback), "
            "or raise "
            "reward.max_error_fraction to train on with failed rows scored 0"
        )
    finally:
        computer.close()


def test_a_reward_that_hangs_on_every_row_stops_the_run_without_waiting_for_them_all(misbehaving, tokenizer):
    cfg = RewardModelConfig(
        function=RewardFunctionConfig(path=misbehaving),
        timeout_s=TIMEOUT_S,
        workers=2,
        max_error_fraction=0.25,
    )
    computer = RewardComputer(cfg, tokenizer)
    start = time.monotonic()
    try:
        with pytest.raises(RewardFunctionError) as info:
            computer.score(rollout(tokenizer, ["sleep"] * 16, ["s"] * 16, ["x"] * 16))
    finally:
        computer.close()
    # 5 failures (more than 0.25 · 16) on 2 workers: 3 rounds of TIMEOUT_S, not 8
    assert time.monotonic() - start < 6 * TIMEOUT_S + 2
    assert re.match(
        rf"reward function compute_score from .* failed on 5 of the first \d+ of 16 rows of this step "
        rf"\(reward.max_error_fraction=0.25 allows 4\); the first, batch row \d+, dataset row \d+ \(data_source "
        rf"'s'\): timed out after {TIMEOUT_S:g}s\. ",
        str(info.value),
    )


def test_a_step_where_every_row_fails_stops_at_any_max_error_fraction(misbehaving, tokenizer, caplog):
    cfg = RewardModelConfig(
        function=RewardFunctionConfig(path=misbehaving), max_error_fraction=1.0, workers=1
    )
    computer = RewardComputer(cfg, tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="megarl.rewards"):
            with pytest.raises(
                RewardFunctionError, match=r"failed on 2 of 2 rows .*allows 2\); the first, batch row 0"
            ):
                computer.score(rollout(tokenizer, ["exit", "raise"], ["s"] * 2, ["x"] * 2))
    finally:
        computer.close()
    # the first failure's traceback, from the reward worker, is in the log the error points to
    (record,) = caplog.records
    assert "the reward function called sys.exit(3)" in record.getMessage()
    assert (
        "Traceback (most recent call last):" in record.getMessage() and "sys.exit(3)" in record.getMessage()
    )


def test_in_the_driver_process_sys_exit_is_a_counted_error_not_an_exit(misbehaving, tokenizer):
    cfg = RewardModelConfig(function=RewardFunctionConfig(path=misbehaving), workers=0)
    scores, metrics = RewardComputer(cfg, tokenizer).score(
        rollout(tokenizer, ["exit", "ok"], ["s"] * 2, ["x"] * 2)
    )
    assert scores.tolist() == [0.0, 1.0] and metrics["reward/errors"] == 1


def test_a_function_that_cannot_be_pickled_runs_in_the_driver_with_a_warning(tokenizer, caplog):
    lock = threading.Lock()

    def locked_score(data_source, solution_str, ground_truth, extra_info=None):
        with lock:
            return float(solution_str == ground_truth)

    computer = RewardComputer(RewardModelConfig(), tokenizer)
    computer.use_function(locked_score, "reward function locked")
    with caplog.at_level(logging.WARNING, logger="megarl.rewards"):
        scores, _ = computer.score(rollout(tokenizer, ["a", "b"], ["s"] * 2, ["a"] * 2))
    assert scores.tolist() == [1.0, 0.0] and computer.workers == 0
    assert (
        caplog.records[0]
        .getMessage()
        .startswith(
            "reward function locked cannot be sent to reward worker processes (TypeError: cannot pickle "
            "'_thread.lock' object); it runs in the driver process, without reward.timeout_s"
        )
    )


def test_the_countdown_exponent_chain_scores_at_once_in_a_reward_worker(tokenizer):
    """TinyZero's eval never returns on it; megarl's parser refuses `**`: a wrong equation (0.1)."""
    computer = RewardComputer(RewardModelConfig(timeout_s=5.0, workers=1), tokenizer)
    texts = ["<answer>99**98**97</answer>", "<answer>(99-97)*98</answer>"]
    truth = {"target": 196, "numbers": [99, 98, 97]}
    batch = rollout(tokenizer, texts, ["countdown"] * 2, [truth] * 2)
    batch.non_tensors["response_text"] = texts  # scored as written (the tiny tokenizer's R=6 would cut them)
    start = time.monotonic()
    try:
        scores, metrics = computer.score(batch)
    finally:
        computer.close()
    assert scores.tolist() == pytest.approx([0.1, 1.0]) and metrics["reward/errors"] == 0
    assert time.monotonic() - start < 5.0  # no time-out: the first row returned


def test_a_row_without_ground_truth_fails_the_rule_reward_instead_of_matching_none(tokenizer):
    computer = RewardComputer(RewardModelConfig(workers=0), tokenizer)
    batch = rollout(tokenizer, ["None", "13459"], ["megarl/digits_sort"] * 2, [None, "13459"])
    scores, metrics = computer.score(batch)
    assert scores.tolist() == [0.0, 1.0] and metrics["reward/errors"] == 1  # "None" used to score 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_containment_keys_are_checked_at_load_time():
    from megarl.config import ConfigError, load_config

    def problems(*overrides: str) -> str:
        with pytest.raises(ConfigError) as info:
            load_config(None, list(overrides), check_paths=False)
        return str(info.value)

    text = problems("reward.timeout_s=-1", "reward.max_error_fraction=1.5", "reward.workers=-2")
    assert "reward.timeout_s=-1.0 must be a number of seconds ≥ 0 (0 = no limit); e.g. 10" in text
    assert "reward.max_error_fraction=1.5 must be in [0, 1]; e.g. 0.5 (1 = stop only when every row" in text
    assert "reward.workers=-2 must be ≥ 0 (0 = in the driver process); e.g. 2" in text
    # a NaN is refused first, alone, by the check of every float key (megarl.config.field_checks)
    assert "reward.max_error_fraction=nan is not a finite number" in problems("reward.max_error_fraction=nan")
    cfg = load_config(None, [], check_paths=False).reward
    assert (cfg.timeout_s, cfg.max_error_fraction, cfg.workers) == (10.0, 0.5, None)


def test_the_console_line_shows_the_reward_errors(tmp_path):
    import io

    from megarl.observe.progress import ProgressLog

    log = ProgressLog(tmp_path, 5, ["console"], stream=io.StringIO(), writer=False)
    metrics = {"reward/mean": 0.25, "reward/std": 0.5, "step_seconds": 2.0}
    assert (
        log.line(2, {**metrics, "reward/errors": 3.0})
        == "step 2/5 | reward 0.250 ±0.500 | reward errors 3 | 2.0s"
    )
    assert log.line(2, {**metrics, "reward/errors": 0.0}) == "step 2/5 | reward 0.250 ±0.500 | 2.0s"


def test_start_loads_the_workers_ahead_and_an_rm_only_reward_starts_none(tokenizer):
    computer = RewardComputer(RewardModelConfig(workers=2), tokenizer)
    computer.start()
    try:
        assert computer._pool is not None and len(computer._pool.workers) == 2
        scores, _ = computer.score(rollout(tokenizer, ["13459"], ["megarl/digits_sort"], ["13459"]))
        assert scores.tolist() == [1.0] and computer._pool.started_workers == 2  # the same two
    finally:
        computer.close()
    rm_only = RewardComputer(RewardModelConfig(weights={"function": 0.0}), tokenizer)
    rm_only.start()
    assert rm_only._pool is None


def test_workers_killed_from_outside_between_runs_are_replaced(misbehaving):
    import signal

    pool = RewardPool(FunctionSpec.file(misbehaving, "compute_score"), 2, TIMEOUT_S, "misbehaving")
    try:
        pool.start()  # one may still be loading when it is killed
        for worker in pool.workers:
            os.kill(worker.proc.pid, signal.SIGKILL)
        assert pool.run(_calls(["ok"] * 8)) == [Scored(1.0, {})] * 8
        assert pool.started_workers == 4
    finally:
        pool.close()
