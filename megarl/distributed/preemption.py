"""Stop signals: how a run ends when a scheduler or a user asks it to (SIGTERM, SIGUSR1), and how the
processes of a run die with their parent. The one place megarl handles signals; its users:

- every trainer process (the Ray driver, every torchrun rank): `PREEMPTION.install()` at the start of
  a job; while `deferred(grace_s)` (the step loop) a signal only asks the loop to stop after the step
  that runs, which must finish within `grace_s` or is abandoned (`Preempted` raised wherever the
  process is); outside it (start-up, the final export) a signal stops the process at once. The loop
  asks `stop_requested()` after every step — under torchrun every rank agrees (one all-reduce), so all
  stop after the same step —, saves a checkpoint of it and raises `Preempted`;
- `megarl train trainer.launcher=torchrun` (the torchrun supervisor): forwards the signal to torchrun
  once, and starts torchrun with `die_with_parent` (ranks call it too), so a SIGKILLed supervisor
  leaves nothing running.

SIGINT (Ctrl-C) keeps Python's KeyboardInterrupt: it stops at once. A repeated SIGTERM/SIGUSR1 changes
nothing (a scheduler may signal every process of a job, and torchrun forwards the same signal again).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from megarl.errors import EXIT_PREEMPTED, MegarlError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # SIGUSR1: `sbatch --signal=B:USR1@120`'s warning


class Preempted(MegarlError):
    """The run was stopped by a stop signal; rerunning the same command resumes it (exit code 75)."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, message: str, signal_name: str = "SIGTERM", abandoned: bool = False) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.abandoned = abandoned  # the running step did not finish: no checkpoint of it


class Preemption:
    """This process's stop-signal state (one per process: `PREEMPTION`)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None  # the first stop signal received
        self.received_at: float | None = None
        self.grace_s: float | None = None  # set while the step loop defers signals
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def install(self) -> None:
        """Handle SIGTERM and SIGUSR1 in this process (main thread only; elsewhere a no-op)."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        """Give SIGTERM and SIGUSR1 back their previous handlers and forget any signal received."""
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
            self._disarm()
        self._previous.clear()
        self.signal_name = self.received_at = self.grace_s = None

    @contextmanager
    def deferred(self, grace_s: float) -> Iterator[None]:
        """Inside: a stop signal lets the running step finish for `grace_s` seconds (then `Preempted`
        is raised wherever the process is); the loop asks `stop_requested()` after every step."""
        self.grace_s = grace_s
        try:
            if self.requested:  # a signal came before the loop began: stop at once
                raise self._error()
            yield
        finally:
            self.grace_s = None
            self._disarm()

    def stop_requested(self, collective: bool = False) -> bool:
        """Whether to stop now (after a finished step); `collective`: under torchrun, every rank calls
        it at the same point and they agree (any rank signalled = all stop). Stops the grace timer."""
        wanted = self.requested
        if collective:
            wanted = agree(wanted)
            if wanted and self.signal_name is None:  # another rank's signal: the same stop here
                self.signal_name = "SIGTERM (on another rank)"
        if wanted:
            self._disarm()
        return wanted

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            return
        self.signal_name = signal.Signals(signum).name
        self.received_at = time.monotonic()
        if self.grace_s is None:  # not in the step loop: nothing to finish
            raise self._error()
        if self.grace_s <= 0:
            raise self._error(abandoned=True)
        signal.signal(signal.SIGALRM, self._on_grace_over)
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def _on_grace_over(self, signum: int, frame: FrameType | None) -> None:
        raise self._error(abandoned=True)

    def _disarm(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _error(self, abandoned: bool = False) -> Preempted:
        name = self.signal_name or "SIGTERM"
        if abandoned:
            why = f"the running step did not finish within trainer.preempt_grace_s={self.grace_s:g}"
            return Preempted(f"stopped by {name}: {why}", name, abandoned=True)
        return Preempted(
            f"stopped by {name} outside a training step (starting or finishing): nothing new to save; rerun "
            "the same command to continue from the last checkpoint (exit code 75)",
            name,
        )


PREEMPTION = Preemption()


def agree(flag: bool) -> bool:
    """`flag` OR-ed over every rank of the default process group (itself without one)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


# ---- processes that die with their parent ----------------------------------------------------------

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent dies (Linux; elsewhere a no-op); if
    the parent is already gone, exit now. For `subprocess.Popen(preexec_fn=...)` and for ranks."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # it died before the kernel was told: re-parented already
        os.kill(os.getpid(), sig)
