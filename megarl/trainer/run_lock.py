"""One run per `trainer.output_dir`: a lock file, `<output_dir>/run.lock`, held by the run's writer
process (the Ray driver; under torchrun, the `megarl train` process that starts torchrun, or rank 0).

    lock = RunLock.acquire(output_dir)    # RunDirInUseError naming the holder when another run has it
    ...
    lock.release()                        # also done by the kernel when the process dies

The file holds the holder's pid, host, start time and a token; the exclusion itself is an flock on it,
which the kernel drops when the holder exits however it exits (SIGKILL included), so a lock left by a
dead run is taken over, with one line that says so. The processes a holder launches (torchrun ranks,
`handed_to_children`) find its token in MEGARL_RUN_LOCK_TOKEN and use the run directory under its lock;
without a launcher's lock, torchrun's rank 0 takes it, and the other ranks write nothing until it has.

The job runner takes the lock before anything is written (`hold_for_job`); the RunSession then claims
it (`claim`), or takes it itself when a trainer is built in Python. Two trainers of one process on the
same directory are refused like two runs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from megarl.controller.rank_status import pid_alive
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.output_guard import OutputWriteError

LOCK_FILE = "run.lock"
TOKEN_ENV = "MEGARL_RUN_LOCK_TOKEN"  # the launching holder's token, for the processes it starts
RANK_WAIT_S = 120.0  # how long a torchrun rank > 0 waits for its rank 0 to take the lock

_HELD: dict[str, RunLock] = {}  # the locks this process holds (or uses under its launcher's), by path


class RunDirInUseError(MegarlError):
    """Another run (or another trainer of this process) writes to the same trainer.output_dir."""

    exit_code = EXIT_USAGE


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _alive(pid: Any) -> bool:
    """Whether process `pid` (as the lock file holds it: maybe not a number) runs on this host."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    return pid > 0 and pid_alive(pid)


def _lock_path(output_dir: str | os.PathLike) -> Path:
    return Path(os.path.abspath(output_dir)) / LOCK_FILE


def _describe(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid')} on host {holder.get('host')}, running since {holder.get('since')}"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        holder = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


class RunLock:
    def __init__(self, path: Path, fd: int | None, holder: dict[str, Any]) -> None:
        self.path, self._fd, self.holder = path, fd, holder
        self.claimed = False  # by a RunSession (one per lock)

    @property
    def token(self) -> str:
        return str(self.holder["token"])

    @classmethod
    def acquire(
        cls, output_dir: str | os.PathLike, say: Callable[[str], None] = print, token: str | None = None
    ) -> RunLock:
        """Take `<output_dir>/run.lock` (creating the directory) or raise RunDirInUseError naming the
        holder and what to do. A lock its holder left behind (the holder has exited) is taken over, and
        `say` gets one line about it."""
        path = _lock_path(output_dir)
        out = path.parent
        if str(path) in _HELD:
            raise RunDirInUseError(
                f"trainer.output_dir={out} is already used by another trainer of this process; close() that "
                "trainer first (or use `with`), or give this one another trainer.output_dir"
            )
        while True:
            try:
                out.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OutputWriteError.of(e, out, key="trainer.output_dir") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirInUseError(_refusal(out, path, _read(path))) from None
            except OSError as e:  # a file system without flock: the file's pid is all there is to go by
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                holder = _read(path)
                if holder and (holder.get("host") != socket.gethostname() or _alive(holder.get("pid"))):
                    os.close(fd)
                    raise RunDirInUseError(_refusal(out, path, holder)) from None
            try:  # the holder may have released (and removed) the file between our open and flock
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read(path)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
        holder["token"] = token or uuid.uuid4().hex
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        os.fsync(fd)
        if previous:
            say(
                f"megarl: took over {path} from a run that is no longer running ({_describe(previous)}); "
                "its files stay as they are"
            )
        lock = cls(path, fd, holder)
        _HELD[str(path)] = lock
        return lock

    @classmethod
    def under_launcher(cls, output_dir: str | os.PathLike, token: str) -> RunLock:
        """The lock the process that launched this one holds (its token in MEGARL_RUN_LOCK_TOKEN): used,
        never released, here. RunDirInUseError when the file names another holder."""
        path = _lock_path(output_dir)
        holder = _read(path)
        if holder is None or holder.get("token") != token:
            raise RunDirInUseError(
                f"the process that started this one ({TOKEN_ENV}={token}) does not hold {path}"
                + (f"; {_describe(holder)} does" if holder else "")
                + ": start the run with one launcher, or give it another trainer.output_dir"
            )
        lock = cls(path, None, holder)
        _HELD[str(path)] = lock
        return lock

    def release(self) -> None:
        """Remove the file and drop the lock (idempotent). Only the holder removes it."""
        if _HELD.get(str(self.path)) is self:
            del _HELD[str(self.path)]
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still locked, so no one takes a file about to vanish
        os.close(fd)


def _refusal(out: Path, path: Path, holder: dict[str, Any] | None) -> str:
    if holder is None:
        who = "another process that is taking it right now"
    else:
        who = _describe(holder)
        if holder.get("host") == socket.gethostname() and not _alive(holder.get("pid")):
            who += (
                f" (it has exited, but a process it started still holds the lock: `fuser -v {path}` lists it)"
            )
    return (
        f"trainer.output_dir={out} is in use by another megarl run: {who}; lock file {path}. Wait for that run "
        "to finish (or stop it), or give this run another trainer.output_dir"
    )


def claim(output_dir: str | os.PathLike, say: Callable[[str], None] = print) -> Callable[[], None]:
    """A RunSession's hold on its output directory: the lock this process's job runner took, or one it
    takes now. Returns what the session calls at close."""
    lock = _HELD.get(str(_lock_path(output_dir)))
    if lock is None:
        lock = RunLock.acquire(output_dir, say)
        lock.claimed = True
        return lock.release
    if lock.claimed:
        RunLock.acquire(output_dir, say)  # raises: another trainer of this process has it
    lock.claimed = True

    def unclaim() -> None:
        lock.claimed = False

    return unclaim


@contextlib.contextmanager
def hold_for_job(
    output_dir: str | os.PathLike, rank: int | None, say: Callable[[str], None] = print
) -> Iterator[RunLock | None]:
    """The job runner's lock, before anything is written. `rank`: this process's torchrun rank, None for
    the Ray driver and for the `megarl train` process that starts torchrun (`handed_to_children` passes
    its token to the ranks). A rank uses its launcher's lock; without one, rank 0 takes it and every other
    rank waits until rank 0 has it. Yields the lock this process holds, if any."""
    if rank is None:
        lock = RunLock.acquire(output_dir, say)
        try:
            yield lock
        finally:
            lock.release()
        return
    token = os.environ.get(TOKEN_ENV)
    used: RunLock | None
    if token is not None:
        used = RunLock.under_launcher(output_dir, token) if rank == 0 else None
    elif rank == 0:
        used = RunLock.acquire(output_dir, say, token=_torchrun_job())
    else:
        _wait_for_rank0(_lock_path(output_dir), _torchrun_job())
        used = None
    try:
        yield used
    finally:
        if used is not None:
            used.release()


@contextlib.contextmanager
def handed_to_children(lock: RunLock) -> Iterator[None]:
    """The processes started meanwhile (torchrun and its ranks) use `lock` as their launcher's."""
    os.environ[TOKEN_ENV] = lock.token
    try:
        yield
    finally:
        os.environ.pop(TOKEN_ENV, None)


def _torchrun_job() -> str:
    """What names this torchrun job to its ranks: its rendezvous (master address and port, run id)."""
    env = os.environ
    return f"torchrun:{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}:{env.get('TORCHELASTIC_RUN_ID', '')}"


def _wait_for_rank0(path: Path, token: str, timeout_s: float = RANK_WAIT_S) -> None:
    """A rank > 0 writes nothing into the run directory before its rank 0 holds the lock (rank 0 of a run
    refused there exits, and torchrun stops this rank)."""
    deadline, holder = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        holder = _read(path)
        if holder is not None and holder.get("token") == token:
            return
        time.sleep(0.2)
    raise RunDirInUseError(
        f"rank 0 of this torchrun job did not take {path} within {timeout_s:.0f} s"
        + (f" ({_describe(holder)} holds it)" if holder else "")
        + "; give this run another trainer.output_dir, or check rank 0's output"
    )
