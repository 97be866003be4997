"""Per-rank status files of an SPMD run (torchrun/srun), and the post-mortem read from them when it fails.

Every rank keeps `<trainer.output_dir>/status/rank_<r>.json`:

    {"rank": 1, "host": "node3", "pid": 4242, "role": "actor", "method": "actor.update", "in_call": true,
     "step": 2, "state": "running", "error": null, "updated": 1767225600.1}

`state` is "running" until the rank's program ends: "done" (returned), "preempted" (stopped by a stop
signal) or "failed" (raised; `error` says what). The SPMD worker group rewrites it before and after every dispatched call (a small atomic JSON
write). A rank whose process is gone while its file still says "running" was killed (or stopped by
torchrun after another rank failed); `post_mortem` tells which rank it was and what the others were doing.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from megarl.atomic_write import write_text_atomically
from megarl.observe.worker_logs import LOGS_DIR

STATUS_DIR = "status"


class RankStatus:
    """This process's status file; every method is a no-op until `open`."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.fields: dict[str, Any] = {}

    def open(self, directory: str | os.PathLike, rank: int) -> None:
        self.path = Path(directory) / f"rank_{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields = {
            "rank": rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "role": None,
            "method": None,
            "in_call": False,
            "step": None,
            "state": "running",
            "error": None,
        }
        self._write()

    def set_step(self, step: int) -> None:
        """The training step now running (written with the next call)."""
        self.fields["step"] = step

    def call(self, role: str, method: str) -> None:
        self.fields.update(role=role, method=f"{role}.{method}", in_call=True)
        self._write()

    def returned(self) -> None:
        self.fields["in_call"] = False
        self._write()

    def finish(self, error: BaseException | None = None) -> None:
        """The rank's program ended: "done", "preempted" (a stop signal, `Preempted`) or "failed", with
        the error's first lines."""
        from megarl.distributed.preemption import Preempted

        if error is None:
            self.fields.update(state="done", error=None)
        elif isinstance(error, Preempted):
            self.fields.update(state="preempted", error=str(error))
        else:
            text = f"{type(error).__name__}: {error}".strip()
            self.fields.update(state="failed", error="\n".join(text.splitlines()[:4]))
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        self.fields["updated"] = time.time()
        write_text_atomically(self.path, json.dumps(self.fields))  # a reader never sees half a file


RANK_STATUS = RankStatus()


def read_statuses(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Every rank's last status, by rank (files that cannot be read are skipped)."""
    statuses = []
    for path in Path(directory).glob("rank_*.json"):
        try:
            statuses.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(statuses, key=lambda s: s["rank"])


_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+).*?exitcode\s*:\s*(?P<code>-?\d+)[^\n]*?(?:\((?P<sig>SIG\w+)\))?\s*$",
    re.S | re.M,
)


_TIMED_OUT = re.compile(r"timed out|operation timeout", re.I)  # gloo's and NCCL's words


def torchrun_failures(output: str) -> tuple[dict[int, str], int | None]:
    """From torchrun's failure report in `output`: {rank: "SIGKILL" | "exit code 1"} and the root-cause rank."""
    report = output[output.rfind("Failures:") :] if "Failures:" in output else ""
    failures: dict[int, str] = {}
    root = None
    for part, text in enumerate(report.split("Root Cause")):
        for m in _FAILURE.finditer(text):
            rank = int(m["rank"])
            failures[rank] = m["sig"] or f"exit code {m['code']}"
            if part == 1 and root is None:
                root = rank
    return failures, root


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def post_mortem(
    directory: str | os.PathLike,
    returncode: int,
    output: str = "",
    timeout_s: float | None = None,
    resume_advice: str = "",
) -> str:
    """One message about a failed SPMD job: which rank died or hung (host, pid, role, the call it was
    in, the signal torchrun reported), what the other ranks were doing, where each rank's output is
    (`<output_dir>/logs`, beside `directory`), and `resume_advice`: what a rerun does
    (megarl.checkpoint.run.resume_advice, read once the job has ended)."""
    statuses = read_statuses(directory)
    failures, root = torchrun_failures(output)
    lines = [f"the torchrun job failed (exit code {returncode})."]
    if not statuses:
        lines.append(f"no rank wrote a status file under {directory}: the ranks died before the run started")
        return "\n".join(lines + [resume_advice] if resume_advice else lines)
    waited = [s for s in statuses if s["state"] == "failed" and _TIMED_OUT.search(s["error"] or "")]
    culprits, others = [], []
    for s in statuses:
        where, failure = _where(s), failures.get(s["rank"], "")
        if s["state"] == "done":
            others.append((s, "had finished"))
        elif s["state"] == "preempted":
            others.append((s, f"stopped for a stop signal: {s['error']}"))
        elif s["state"] == "failed":
            others.append((s, f"failed {where}: {s['error']}"))
        elif pid_alive(s["pid"]):
            others.append((s, f"is still running {where} (pid alive)"))
        elif s["rank"] == root and failure.startswith("SIG"):
            culprits.append((s, f"was killed by {failure} {where}"))
        elif waited:
            limit = f"{timeout_s:g} s, " if timeout_s else ""
            culprits.append(
                (
                    s,
                    f"hung {where}: the other ranks timed out waiting for it ({limit}trainer.worker_timeout_s)",
                )
            )
        elif failure == "SIGTERM" or any(o["state"] == "failed" for o in statuses):
            others.append((s, f"was stopped by torchrun {where}"))
        elif failure:
            culprits.append((s, f"died ({failure}) {where}"))
        else:
            culprits.append((s, f"died {where} (its process is gone without a failed/done state: killed)"))
    if not culprits:  # nobody died or hung: the ranks that raised are the cause
        culprits = [o for o in others if o[0]["state"] == "failed"]
        others = [o for o in others if o[0]["state"] != "failed"]
    lines += [f"{_who(s)} {what}" for s, what in culprits]
    if others:
        lines.append("the other ranks:")
        lines += [f"  {_who(s)} {what}" for s, what in others]
    logs = sorted(Path(directory).parent.joinpath(LOGS_DIR).glob("*_rank*.log"))
    if logs:
        lines.append(f"each rank's output: {', '.join(map(str, logs))}")
    if resume_advice:
        lines.append(resume_advice)
    return "\n".join(lines)


def _who(s: dict) -> str:
    role = f", role {s['role']}" if s.get("role") else ""
    return f"rank {s['rank']} on {s['host']} (pid {s['pid']}{role})"


def _where(s: dict) -> str:
    step = f" (step {s['step']})" if s.get("step") is not None else ""
    if not s.get("method"):
        return f"during start-up{step}"
    return f"{'in' if s.get('in_call') else 'after'} {s['method']}{step}"
