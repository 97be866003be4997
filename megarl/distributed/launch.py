"""Start a module on N local ranks with torchrun (megarl.distributed.rank_program builds on this), and
supervise a torchrun job so that nothing it started outlives it (`megarl train trainer.launcher=torchrun`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, on `host` ("" = every interface)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_torchrun(
    module: str, args: list[str], nproc: int, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m module args` on `nproc` local ranks (gloo/nccl set up by the module itself)."""
    cmd = [
        sys.executable,
        "-m",
        "megarl.distributed.store",  # torchrun, its store on --master_addr only
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        module,
        *args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


# what torchrun passes on to its ranks (its default list, plus SIGUSR1: SLURM's `--signal` warning)
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@dataclass
class Supervised:
    returncode: int
    output_tail: str  # the last stderr bytes of torchrun and its ranks (torchrun's failure report)
    leftovers: list[str]  # "pid (command)" of processes the job left behind, ended here
    signal_name: str | None = None  # the stop signal this process got and passed on, if any


def supervise(cmd: list[str], env: dict[str, str], tail_bytes: int = 65536) -> Supervised:
    """Run a launcher command (torchrun), passing its stderr through while keeping the tail, then end
    whatever it left behind. This process becomes a child subreaper first (Linux), so helpers orphaned
    by a killed rank (a multiprocessing Manager spawned by megatron's checkpoint save: torchrun only
    signals the process groups of ranks that are still alive) are re-parented here and stopped.

    torchrun runs in a session of its own and dies with this process (SIGKILL included; its ranks die
    with it in turn: `die_with_parent`). SIGTERM, SIGUSR1 and Ctrl-C reach it from here, once: torchrun
    passes them to every rank (TORCHRUN_SIGNALS), which stop as megarl.distributed.preemption says.
    After a stop signal torchrun's own report (its SignalException traceback) stays off the console."""
    import ctypes  # noqa: F401 - imported here, not in the forked child (die_with_parent uses it)

    import psutil

    from megarl.distributed.preemption import STOP_SIGNALS, die_with_parent

    _become_subreaper()
    # exit codes need SIGCHLD at its default: an ignored SIGCHLD (inherited, e.g. from a Ray worker with
    # kill_child_processes_on_worker_exit_with_raylet_subreaper) auto-reaps and every child "exits 0"
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    proc = subprocess.Popen(
        cmd, env=env, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent
    )
    tail = bytearray()
    received: list[str] = []

    def pass_on(signum: int, frame: object) -> None:
        if not received:  # once: a second one would cut torchrun's wait for its ranks short
            proc.send_signal(signum)
        received.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, pass_on) for sig in STOP_SIGNALS}

    def forward() -> None:
        while chunk := os.read(proc.stderr.fileno(), 65536):
            if not received:
                sys.stderr.buffer.write(chunk)
                sys.stderr.buffer.flush()
            tail.extend(chunk)
            del tail[:-tail_bytes]

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    try:
        returncode = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C: torchrun stops its ranks (a second Ctrl-C: ended below)
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        leftovers = end_descendants(spare=before)  # they may hold the pipe open: before the join
        reader.join(timeout=5)
    return Supervised(returncode, tail.decode(errors="replace"), leftovers, received[0] if received else None)


def end_descendants(spare: set[int] = frozenset(), grace_s: float = 1.0) -> list[str]:
    """Every process still below this one except `spare`: given `grace_s` to exit by itself, then
    SIGTERM, then SIGKILL. Returns "pid (name)" of those that had to be signalled."""
    import psutil

    children = [c for c in psutil.Process().children(recursive=True) if c.pid not in spare]
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    names = []
    for child in alive:
        try:
            names.append(f"{child.pid} ({' '.join(child.cmdline()[:3])[:80]})")
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return names


def _become_subreaper() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
