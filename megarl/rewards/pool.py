"""`RewardPool`: reward functions run in worker processes, each call within `reward.timeout_s`.

    pool = RewardPool(FunctionSpec.file("my_reward.py", "compute_score"), size=2, timeout_s=10.0, what="...")
    outcomes = pool.run([{"data_source": ..., "solution_str": ..., "ground_truth": ..., "extra_info": ...}])
    pool.close()

The workers are started once (by `start()` or the first `run`) as plain `python -m megarl.rewards.pool` processes —
no fork of the driver, no re-import of the user's script — and live until `close()`. A `run` cuts its
rows into chunks, a few per worker, and hands them out as workers come free; a worker sends a chunk's
outcomes back in a message or a few. What a reward function does wrong fails its row, not the run:

- an exception or `sys.exit` in the function: caught in the worker (`megarl.rewards.calls`);
- Python code past `timeout_s`: interrupted in the worker (`calls.CallClock`: a SIGALRM tick);
- C code past `timeout_s` (plus a grace second), `os._exit`, a segfault: the worker is killed (or is
  gone); the row it was on — it writes its position into a shared page before each call — fails with
  "timed out after Ns" / "process exited with code 1" / "process died with signal 11 (SIGSEGV)", the
  chunk's rows whose outcomes had not come back go to the queue again, and a new worker replaces it.
  (A worker sends failures at once and other outcomes every 0.1 s, so a crash re-runs little.)

Workers die with the driver (PR_SET_PDEATHSIG, and the end of their command pipe) and ignore Ctrl-C
(the driver stops them).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any

from megarl.errors import MegarlError
from megarl.rewards.calls import CallClock, Failed, Outcome, call_reward

_POSITION = struct.Struct("<dq")  # (monotonic start of the current call, its row's place in the chunk)
_IDLE = -1
_KILL_GRACE_S = 1.0  # after timeout_s, how long SIGALRM gets to interrupt the call before the kill
_MAX_LOSSES = 3  # a row whose worker was lost this often (not on it) fails instead of going back again
_CHUNKS_PER_WORKER = 4
_FLUSH_S = 0.1  # a worker sends the outcomes it has at least this often (failures at once)


@dataclass(frozen=True)
class FunctionSpec:
    """How a worker finds the reward function: a function in a file (the worker imports it itself), or
    any function pickled by value (cloudpickle; the rule rewards go as `registry.RuleRewards`)."""

    kind: str  # "file" | "pickled"
    path: str = ""
    name: str = ""
    payload: bytes = b""

    @classmethod
    def file(cls, path: str, name: str) -> FunctionSpec:
        return cls("file", path=os.path.abspath(path), name=name)

    @classmethod
    def pickled(cls, fn: Callable[..., Any]) -> FunctionSpec:
        """Raises when `fn` cannot be pickled (a lock, an open file in its closure, ...)."""
        import cloudpickle  # type: ignore[import-untyped]

        return cls("pickled", payload=cloudpickle.dumps(fn))

    def load(self) -> Callable[..., Any]:
        if self.kind == "file":
            from megarl.rewards.custom import load_reward_function

            return load_reward_function(self.path, self.name)
        return pickle.loads(self.payload)  # noqa: S301 - the driver's own function, sent to its own worker


class RewardPoolError(MegarlError, RuntimeError):
    """A reward worker could not start (its function failed to load there)."""


class _Worker:
    def __init__(self, spec: FunctionSpec, timeout_s: float | None) -> None:
        self.conn, child = Pipe()
        self.page_fd = os.memfd_create("megarl-reward-position")
        os.ftruncate(self.page_fd, _POSITION.size)
        self.page = mmap.mmap(self.page_fd, _POSITION.size)
        _POSITION.pack_into(self.page, 0, 0.0, _IDLE)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the driver's imports, also pytest's
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "megarl.rewards.pool", str(child.fileno()), str(self.page_fd)],
            pass_fds=(child.fileno(), self.page_fd),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        child.close()
        self.conn.send((spec, timeout_s))
        self.ready = False
        self.chunk: list[int] | None = None  # the rows it is scoring
        self.received = 0  # how many of them have their outcome back

    def position(self) -> tuple[int, float]:
        """(place in the chunk, start) of the call it is in; place _IDLE between calls. Read place first:
        the worker writes the start first, so a fresh place never comes with a stale start."""
        place = _POSITION.unpack_from(self.page, 0)[1]
        return place, _POSITION.unpack_from(self.page, 0)[0]

    def fate(self) -> str:
        code = self.proc.wait()
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown"
            return f"the reward process died with signal {-code} ({name})"
        return f"the reward process exited with code {code} (os._exit, or a library ending the process)"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()
        self.page.close()
        os.close(self.page_fd)


class RewardPool:
    """Worker processes that score rows with one reward function (see the module doc)."""

    def __init__(self, spec: FunctionSpec, size: int, timeout_s: float | None, what: str) -> None:
        if size < 1:
            raise ValueError(f"a reward pool needs at least one worker, got {size}")
        self.spec, self.size, self.timeout_s, self.what = spec, size, timeout_s, what
        self.workers: list[_Worker] = []
        self.started_workers = 0  # every worker started, replacements included (the bench reads it)
        weakref.finalize(self, _close, self.workers)  # a pool dropped without close() stops its workers

    def run(
        self, rows: list[dict[str, Any]], stop: Callable[[int, Failed], bool] | None = None
    ) -> list[Outcome | None]:
        """The outcome of each row (keyword arguments of one call), in order. `stop(row, failure)` is
        called on each failed row as it is known; when it returns True the run ends at once: the
        busy workers are replaced and the rows not yet scored stay None."""
        try:
            return self._run(rows, stop or (lambda row, failure: False))
        except BaseException:
            _close(self.workers, wait_s=0.0)  # a Ctrl-C or an error leaves workers mid-chunk: kill them
            raise

    def start(self) -> None:
        """Start the workers now, without waiting for them: they load while the caller goes on."""
        while len(self.workers) < self.size:
            self.workers.append(self._start())

    def close(self) -> None:
        _close(self.workers)

    def _start(self) -> _Worker:
        self.started_workers += 1
        return _Worker(self.spec, self.timeout_s)

    def _run(self, rows: list[dict[str, Any]], stop: Callable[[int, Failed], bool]) -> list[Outcome | None]:
        while len(self.workers) < min(self.size, max(1, len(rows))):  # a few rows need fewer workers
            self.workers.append(self._start())
        outcomes: list[Outcome | None] = [None] * len(rows)
        n_chunks = min(len(rows), self.size * _CHUNKS_PER_WORKER)
        queue = deque(_split(list(range(len(rows))), n_chunks))
        losses: dict[int, int] = {}
        startup_deaths: list[str] = []

        def fail(row: int, failure: Failed) -> bool:
            outcomes[row] = failure
            return stop(row, failure)

        def receive(worker: _Worker) -> bool:
            """Take one message from `worker`; True: stop the run."""
            try:
                kind, payload = worker.conn.recv()
            except (EOFError, OSError):
                return lose(worker, worker.fate())
            if kind == "init_error":
                raise RewardPoolError(f"a reward worker could not load {self.what}: {payload}")
            if kind == "ready":
                worker.ready = True
                return False
            assert worker.chunk is not None
            first, scored = payload
            stopped = False
            for row, outcome in zip(worker.chunk[first:], scored):
                if isinstance(outcome, Failed):
                    stopped = fail(row, outcome) or stopped
                else:
                    outcomes[row] = outcome
            worker.received = first + len(scored)
            if kind == "done":
                worker.chunk = None
            return stopped

        def lose(worker: _Worker, why: str) -> bool:
            """Replace a killed or dead worker: the row it was on fails, its chunk's rows without an
            outcome go back to the queue (a row lost with its worker too often fails as well)."""
            chunk, (place, _) = worker.chunk or [], worker.position()
            worker.kill()
            if not worker.ready:  # died loading the function (a crash at import), or killed from outside
                startup_deaths.append(why)
                if len(startup_deaths) >= _MAX_LOSSES:
                    raise RewardPoolError(
                        f"reward workers for {self.what} died while starting: {startup_deaths[0]}"
                    )
            self.workers[self.workers.index(worker)] = self._start()
            unscored = chunk[worker.received :]
            blamed = chunk[place] if worker.received <= place < len(chunk) else None  # None: between calls
            stopped = blamed is not None and fail(blamed, Failed(why))
            rest = []
            for row in unscored:
                if row == blamed:
                    continue
                losses[row] = losses.get(row, 0) + 1
                if losses[row] < _MAX_LOSSES:
                    rest.append(row)
                elif fail(row, Failed(f"{why}; its reward process was lost {_MAX_LOSSES} times")):
                    stopped = True
            if rest:
                queue.appendleft(rest)
            return stopped

        while queue or any(w.chunk is not None for w in self.workers):
            for worker in list(self.workers):
                if worker.ready and worker.chunk is None and queue:
                    worker.chunk, worker.received = queue.popleft(), 0
                    try:
                        worker.conn.send([rows[i] for i in worker.chunk])
                    except OSError:  # it died between chunks
                        if lose(worker, worker.fate()):
                            return self._abort(outcomes)
            waiting = [w for w in self.workers if w.chunk is not None or not w.ready]
            for conn in wait([w.conn for w in waiting], self._next_deadline(waiting)):
                if receive(next(w for w in waiting if w.conn is conn)):
                    return self._abort(outcomes)
            for worker in list(self.workers):
                if worker.chunk is not None and self._overdue(worker):
                    while worker.chunk is not None and worker.conn.poll():  # what it sent before it stuck
                        if receive(worker):
                            return self._abort(outcomes)
                    if worker in self.workers and worker.chunk is not None and self._overdue(worker):
                        if lose(worker, f"timed out after {self.timeout_s:g}s"):
                            return self._abort(outcomes)
        return outcomes

    def _limit(self) -> float | None:
        return None if not self.timeout_s else self.timeout_s + _KILL_GRACE_S

    def _next_deadline(self, waiting: list[_Worker]) -> float | None:
        limit = self._limit()
        if limit is None:
            return None
        starts = [
            start for place, start in (w.position() for w in waiting if w.chunk is not None) if place != _IDLE
        ]
        if not starts:
            return limit  # a chunk on its way in: look again within the limit
        return max(0.0, min(starts) + limit - time.monotonic())

    def _overdue(self, worker: _Worker) -> bool:
        limit = self._limit()
        place, start = worker.position()
        return limit is not None and place != _IDLE and time.monotonic() - start > limit

    def _abort(self, outcomes: list[Outcome | None]) -> list[Outcome | None]:
        for worker in [w for w in self.workers if w.chunk is not None]:
            worker.kill()  # mid-chunk: the next run starts a new one
            self.workers.remove(worker)
        return outcomes


def _close(workers: list[_Worker], wait_s: float = 2.0) -> None:
    """Ask each worker to exit, give them `wait_s`, kill what is left; empties `workers`."""
    for worker in workers:
        if worker.proc.poll() is None:
            try:
                worker.conn.send(None)
            except OSError:
                pass
    deadline = time.monotonic() + wait_s
    for worker in workers:
        try:
            worker.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        worker.kill()
    workers.clear()


def _split(items: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [c for c in out if c]


def _worker_main(conn_fd: int, page_fd: int) -> int:
    """A reward worker: load the function, then score chunks until the driver closes the pipe."""
    import ctypes

    try:  # die with the driver even when stuck in C code
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    conn = Connection(conn_fd)
    page = mmap.mmap(page_fd, _POSITION.size)
    spec, timeout_s = conn.recv()
    try:
        fn = spec.load()
    except BaseException as e:  # noqa: BLE001 - a SystemExit at import too: the driver says what happened
        conn.send(("init_error", f"{type(e).__name__}: {e}"))
        return 1
    conn.send(("ready", None))
    clock = CallClock(timeout_s) if timeout_s else None
    while True:
        try:
            rows = conn.recv()
        except (EOFError, OSError):
            return 0
        if rows is None:
            return 0
        outcomes: list[Outcome] = []
        sent, flushed = 0, time.monotonic()
        with clock or contextlib.nullcontext():
            for place, kwargs in enumerate(rows):
                start = time.monotonic()
                _POSITION.pack_into(page, 0, start, place)
                outcomes.append(call_reward(fn, kwargs, clock))
                # a failure at once, the rest every _FLUSH_S: what a later crash cannot take with it
                if isinstance(outcomes[-1], Failed) or start - flushed > _FLUSH_S:
                    conn.send(("rows", (sent, outcomes[sent:])))
                    sent, flushed = len(outcomes), start
        _POSITION.pack_into(page, 0, time.monotonic(), _IDLE)
        conn.send(("done", (sent, outcomes[sent:])))


if __name__ == "__main__":
    sys.exit(_worker_main(int(sys.argv[1]), int(sys.argv[2])))
