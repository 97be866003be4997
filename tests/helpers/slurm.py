"""A real SLURM on this machine for the launch-script tests: munged, slurmctld and two slurmd ("node1",
"node2", both on 127.0.0.1) started from a generated slurm.conf under one directory, and stopped by PID.

    cluster = SlurmCluster.start(root)        # installs Debian's packages first when they are missing
    job = cluster.sbatch("launch/slurm/torchrun.sbatch", ["configs/x.yaml"], env={...}, nodes=2)
    cluster.wait(job, timeout=300)             # -> the job's final state, from the job-completion log
    cluster.stop()

`cred_expire=5`: a requeued job waits this long before it runs again (SLURM's default is 120 s), and then
for the next scheduling pass: `sched_interval=1` makes the main scheduler's pass every second (its default
60 s, with the backfill pass every 30 s, held a requeued job up to 30 s more; measured: requeue to rerun
7 s instead of 27 s).
No systemd here: the package scripts start nothing, so every daemon is started directly (setsid) and
its PID recorded; a stopped daemon can linger as a zombie (`ps -o stat=` Z), which counts as gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.launch import free_port

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
NODES = ("node1", "node2")
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def ensure_installed() -> None:
    """Debian's SLURM + munge, installed when missing (CI runs as root on a clean machine)."""
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    subprocess.run(cmd, check=True, env=env, capture_output=True)


def _alive(pid: int) -> bool:
    try:
        stat = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return False
    return bool(stat.strip()) and not stat.strip().startswith("Z")


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, root: Path, cpus_per_node: int = 2) -> SlurmCluster:
        ensure_installed()
        root.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "log", "run", "munge"):
            (root / sub).mkdir(exist_ok=True)
        os.chmod(root / "munge", 0o755)  # 0700 fails: "Socket is inaccessible"
        key, socket_path = root / "munge" / "munge.key", root / "munge" / "munge.socket"
        if not key.exists():
            subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
            os.chmod(key, 0o600)
        conf = root / "slurm.conf"
        conf.write_text(_slurm_conf(root, socket_path, cpus_per_node))
        cluster = cls(root, conf, {**os.environ, "SLURM_CONF": str(conf)})
        try:
            cluster._start_daemons(key, socket_path)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_daemons(self, key: Path, socket_path: Path) -> None:
        munge = self.root / "munge"
        self._spawn(
            "munged",
            ["munged", "-F", f"--socket={socket_path}", f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
             f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}", "--force"],
        )  # fmt: skip
        _wait_for(lambda: socket_path.exists(), 15, "munged did not create its socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        _wait_for(lambda: self._ok(["scontrol", "ping"], "UP"), 30, "slurmctld did not answer scontrol ping")
        for node in NODES:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        _wait_for(self._nodes_idle, 60, "the slurmd nodes did not become idle")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        self.pids[name] = proc.pid

    def _ok(self, cmd: list[str], needle: str) -> bool:
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        return out.returncode == 0 and needle in out.stdout

    def _nodes_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env
        )
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in NODES)

    # ---- jobs ----------------------------------------------------------------------------------------

    def sbatch(
        self, script: str | Path, args: list[str], env: dict[str, str] | None = None, **opts: str
    ) -> int:
        """Submit `script args` (sbatch options as keyword arguments: nodes=2, time="5"); its job id."""
        options = [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
        cmd = [
            "sbatch",
            "--parsable",
            f"--output={self.root / 'log' / 'job-%j.out'}",
            *options,
            str(script),
            *args,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**self.env, **(env or {})})
        if out.returncode:
            raise RuntimeError(f"sbatch failed: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def state(self, job: int) -> str | None:
        """The job's final state from the job-completion log (`sacct -c`), None while it runs."""
        states = [s.split()[0] for s in self._completion(job, "State")]
        return states[-1] if states and states[-1] in FINAL_STATES else None

    def exit_code(self, job: int) -> str | None:
        """The finished job's `EXIT:SIGNAL` ("0:0" for a clean exit), from the job-completion log."""
        codes = self._completion(job, "ExitCode")
        return codes[-1] if codes else None

    def _completion(self, job: int, field: str) -> list[str]:
        out = subprocess.run(
            ["sacct", "-c", "-n", "-P", "-j", str(job), "-o", field],
            capture_output=True,
            text=True,
            env=self.env,
        )
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]

    def wait(self, job: int, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job)
            if state is not None:
                return state
            time.sleep(1)
        raise TimeoutError(
            f"SLURM job {job} did not finish in {timeout:.0f} s; log:\n{self.log(job)[-3000:]}"
        )

    def log(self, job: int) -> str:
        path = self.root / "log" / f"job-{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def scancel(self, job: int, *options: str) -> None:
        """`scancel OPTIONS JOB`: cancel the job, or with --signal=SIG [--batch] signal it."""
        subprocess.run(["scancel", *options, str(job)], capture_output=True, env=self.env)

    def states(self, job: int) -> list[str]:
        """Every recorded end of the job (a requeued job has one per run), oldest first."""
        return [s.split()[0] for s in self._completion(job, "State")]

    # ---- teardown ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel every job, then SIGTERM each daemon by recorded PID (slurmd first); idempotent."""
        subprocess.run(["scancel", "--user=root"], capture_output=True, env=self.env)
        for name in sorted(self.pids, key=lambda n: (not n.startswith("slurmd"), n == "munged")):
            pid = self.pids[name]
            if _alive(pid):
                os.killpg(pid, signal.SIGTERM)
            _wait_for(lambda p=pid: not _alive(p), 20, None)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
        self.pids.clear()


def _wait_for(ok, timeout: float, message: str | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    if message is not None:
        raise RuntimeError(message)


def _slurm_conf(root: Path, socket_path: Path, cpus: int) -> str:
    host = socket.gethostname().split(".")[0]
    ports = [free_port() for _ in range(len(NODES) + 1)]
    nodes = "\n".join(
        f"NodeName={node} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory=1000 State=UNKNOWN"
        for node, port in zip(NODES, ports[1:])
    )
    return f"""ClusterName=megarl-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={socket_path},cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
MailProg={shutil.which("true")}
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root / "log" / "jobcomp.txt"}
SchedulerParameters=batch_sched_delay=0,sched_interval=1
EnforcePartLimits=ALL
SlurmdParameters=config_overrides
KillWait=5
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "state" / "%n"}
SlurmctldPidFile={root / "run" / "slurmctld.pid"}
SlurmdPidFile={root / "run" / "slurmd-%n.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd-%n.log"}
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""
