"""What the launch-script tests share: a two-step tiny GRPO run's overrides, and checks that a finished
launch left no process of its own (torchrun ranks, Ray daemons) behind."""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "quickstart_grpo.yaml"
RAY_PROCESS_NAMES = (
    "raylet",
    "gcs_server",
    "ray::",
    "default_worker",
    "log_monitor",
    "dashboard",
    "ray start",
)


def run_overrides(tiny_run: dict, out: Path, *extra: str) -> list[str]:
    """Two small GRPO steps of the random tiny Llama (what they learn does not matter here)."""
    return [
        f"model.path={tiny_run['model']}",
        f"data.train_files=[{tiny_run['data'] / 'train.parquet'}]",
        "data.val_files=[]",
        f"trainer.output_dir={out}",
        "trainer.total_steps=2",
        "trainer.eval_every=0",
        "trainer.save_every=-1",
        "data.train_batch_size=8",
        "algorithm.ppo_mini_batch_size=8",
        "rollout.n=4",
        "actor.micro_batch_size=8",
        "ref.micro_batch_size=8",
        "logging.backends=[console]",
        "logging.report=false",
        *extra,
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(**extra: str) -> dict[str, str]:
    """What a launched job needs to run this checkout with the test's Python."""
    return {"MEGARL_PYTHON": sys.executable, "PYTHONPATH": str(REPO), **extra}


def steps_written(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def leftovers(marker: str) -> list[str]:
    """Live processes whose command line mentions `marker` (a run's output dir, say)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if marker in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.info['pid']}: {cmd[:160]}")
        except psutil.Error:
            pass
    return found


def assert_nothing_left(marker: str, grace_s: float = 20) -> None:
    deadline = time.monotonic() + grace_s
    while leftovers(marker) and time.monotonic() < deadline:
        time.sleep(1)
    assert not leftovers(marker), leftovers(marker)


def ray_processes() -> set[int]:
    """PIDs of live Ray processes on this machine (any cluster: callers compare before and after)."""
    pids = set()
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            text = f"{proc.info['name']} {' '.join(proc.info['cmdline'] or [])}"
            if any(n in text for n in RAY_PROCESS_NAMES) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                pids.add(proc.info["pid"])
        except psutil.Error:
            pass
    return pids


def assert_no_new_ray_processes(before: set[int], grace_s: float = 30) -> None:
    deadline = time.monotonic() + grace_s
    while (ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(1)
    new = ray_processes() - before
    assert not new, [" ".join(psutil.Process(p).cmdline())[:160] for p in new if psutil.pid_exists(p)]


def non_loopback_listeners(pids: list[int]) -> list[str]:
    """ "pid name ip:port" of every TCP socket the processes `pids` listen on beyond loopback."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and not _is_loopback(conn.laddr.ip):
                    found.append(f"{pid} {proc.name()} {conn.laddr.ip}:{conn.laddr.port}")
        except psutil.Error:
            continue
    return found


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 (gRPC's dual-stack sockets)
    return (mapped or address).is_loopback
