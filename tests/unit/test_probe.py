"""The error probe (tests/helpers/error_probe*.py): every bad input a user or an adversary tried ends
`megarl` with one clear message and the documented exit code. tools/error_probe.py writes the same
table to docs/error-probe.md."""

import os
import signal
import threading
import time

import pytest

from tests.helpers.error_probe import Unavailable, Workspace, run_case
from tests.helpers.error_probe_cases import ALL_CASES, CASES, ISSUE_CASES

pytestmark = [pytest.mark.unit, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

RUN_HERE = [c for c in ALL_CASES if c.make is not None]


@pytest.fixture(autouse=True)
def ctrl_c_as_in_a_fresh_process():
    """Ctrl-C raises KeyboardInterrupt in this process, as in a fresh `megarl` process: the signal cases
    send a real SIGINT here, and an earlier test of the session may have left SIGINT ignored or blocked
    (a whole CI run failed both cases, each passing alone)."""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    signal.signal(signal.SIGINT, handler if handler is not None else signal.default_int_handler)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_models):
    ws = Workspace(tmp_path_factory.mktemp("probe"), tiny_models["llama"])
    yield ws
    ws.close()


@pytest.mark.parametrize("case", RUN_HERE, ids=lambda c: c.id)
def test_probe_case(workspace, case):
    try:
        outcome = run_case(case, workspace)
    except Unavailable as e:
        pytest.skip(str(e))
    assert outcome.exit_code == case.exit_code, outcome.output
    assert outcome.message, outcome.output
    for fragment in case.expect:
        assert fragment in outcome.message, f"{fragment!r} not in:\n{outcome.message}"
    assert "Traceback" not in outcome.output


def test_the_table_has_80_cases_with_unique_ids_and_a_test_each():
    ids = [c.id for c in ALL_CASES]
    assert len(ids) == len(set(ids))
    assert len(ISSUE_CASES) == 29 and len(ALL_CASES) >= 80
    for case in ALL_CASES:
        assert case.expect or case.message, f"{case.id} asserts nothing"
        assert case.make is not None or case.test != CASES[0].test, f"{case.id} is run nowhere"


def test_ctrl_c_while_rewards_are_scored_kills_every_reward_worker_at_once(tmp_path):
    """S02: a real SIGINT while both reward workers are inside a call: the KeyboardInterrupt reaches the
    driver at once and no worker is left (the run's model workers are stopped by the same except)."""
    from megarl.rewards.pool import FunctionSpec, RewardPool

    slow = tmp_path / "slow.py"
    slow.write_text("import time\n\ndef compute_score(*args, **kwargs):\n    time.sleep(60)\n")
    pool = RewardPool(FunctionSpec.file(str(slow), "compute_score"), 2, 30.0, "slow")
    pool.start()
    pids = [w.proc.pid for w in pool.workers]
    row = {"data_source": "s", "solution_str": "x", "ground_truth": "x", "extra_info": None}
    ctrl_c = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.run([row] * 4)  # blocks ≥ 30 s unless interrupted
    finally:
        ctrl_c.join()
        pool.close()
    assert time.monotonic() - start < 5
    assert pool.workers == [] and not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
