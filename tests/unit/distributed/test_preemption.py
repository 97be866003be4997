"""Stop signals in one process (real signals sent to this process), the step loop's stop after a
finished step or after the grace, and processes that die with their parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from megarl.distributed.preemption import Preempted, Preemption
from megarl.errors import EXIT_PREEMPTED
from megarl.trainer.run_session import SessionTrainer

pytestmark = pytest.mark.unit


@pytest.fixture
def preemption(monkeypatch):
    state = Preemption()
    monkeypatch.setattr("megarl.trainer.run_session.PREEMPTION", state)
    state.install()
    yield state
    state.uninstall()


def deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs in the main thread at the next bytecode


def test_a_signal_outside_the_step_loop_stops_at_once(preemption):
    with pytest.raises(Preempted, match="stopped by SIGUSR1 outside a training step") as stopped:
        deliver(signal.SIGUSR1)
    assert stopped.value.exit_code == EXIT_PREEMPTED == 75 and not stopped.value.abandoned


def test_inside_the_loop_a_signal_waits_for_the_step_and_repeats_change_nothing(preemption):
    with preemption.deferred(grace_s=30):
        deliver(signal.SIGTERM)
        deliver(signal.SIGUSR1)  # a scheduler and torchrun may both signal a rank
        assert preemption.signal_name == "SIGTERM"
        assert preemption.stop_requested()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the grace timer is stopped


def test_a_step_that_outlasts_the_grace_is_abandoned(preemption):
    start = time.monotonic()
    with pytest.raises(Preempted, match=r"did not finish within trainer.preempt_grace_s=0.3") as stopped:
        with preemption.deferred(grace_s=0.3):
            deliver(signal.SIGTERM)
            while time.monotonic() - start < 10:  # a long step
                time.sleep(0.01)
    assert stopped.value.abandoned and time.monotonic() - start < 2


def test_uninstall_gives_the_handlers_back(monkeypatch):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        state = Preemption()
        state.install()
        assert signal.getsignal(signal.SIGTERM) == state._on_signal
        state.uninstall()
        assert signal.getsignal(signal.SIGTERM) is mine and not state.requested
    finally:
        signal.signal(signal.SIGTERM, previous)


class Loop(SessionTrainer):
    """SessionTrainer's step loop over steps that take `step_s` each, saving when asked."""

    def __init__(self, tmp_path: Path, total: int, step_s: float, signal_at: int | None, grace_s=30.0):
        checkpoints = SimpleNamespace(root=tmp_path / "checkpoints", saved_step=None)
        cfg = SimpleNamespace(trainer=SimpleNamespace(launcher="ray", preempt_grace_s=grace_s))
        self.session = SimpleNamespace(cfg=cfg, checkpoints=checkpoints, start_step=0, total_steps=total)  # type: ignore[assignment]
        self.done_step, self.step_s, self.signal_at, self.saved = 0, step_s, signal_at, []

    def step(self):
        if self.done_step + 1 == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(self.step_s)
        self.done_step += 1

    def save_checkpoint(self, step):
        self.saved.append(step)
        self.session.checkpoints.saved_step = step
        return {}


def test_the_loop_stops_after_the_signalled_step_and_saves_it(preemption, tmp_path):
    loop = Loop(tmp_path, total=10, step_s=0.2, signal_at=3)
    with pytest.raises(Preempted) as stopped:
        loop._train_to_target()
    assert loop.done_step == 3 and loop.saved == [3]
    assert str(stopped.value) == (
        f"stopped by SIGTERM after step 3: checkpoint {tmp_path / 'checkpoints' / 'step_3'} saved; "
        "rerun the same command to resume from it (exit code 75)"
    )


def test_the_loop_abandons_a_step_past_the_grace_naming_the_last_checkpoint(preemption, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_1\n")  # a resumed run's
    loop = Loop(tmp_path, total=10, step_s=3.0, signal_at=2, grace_s=0.2)
    loop.done_step = loop.session.start_step = 1
    with pytest.raises(Preempted) as stopped:
        loop._train_to_target()
    assert loop.saved == [] and stopped.value.abandoned
    assert str(stopped.value) == (
        "stopped by SIGTERM: step 2 did not finish within trainer.preempt_grace_s=0.2 and was abandoned; "
        f"the last checkpoint, {tmp_path / 'checkpoints' / 'step_1'}, stays; rerun the same command to "
        "resume from it (exit code 75)"
    )


CHILD = """
import subprocess, sys, time
from megarl.distributed.preemption import die_with_parent
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent)
print(grandchild.pid, flush=True)
time.sleep(60)
"""


def test_a_child_started_with_die_with_parent_dies_when_its_parent_is_sigkilled():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    parent = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        grandchild = psutil.Process(int(parent.stdout.readline()))
        parent.kill()
        parent.wait()
        grandchild.wait(timeout=10)  # psutil.TimeoutExpired if it outlived its parent
    finally:
        parent.kill()
