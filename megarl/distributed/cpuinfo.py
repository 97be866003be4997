"""Fields of this host's /proc/cpuinfo: the CPU vendor picks the GEMM path (models/cpu_gemm.py), the
model name is recorded in run_info.json (observe/machine.py)."""

from __future__ import annotations


def cpuinfo_field(name: str) -> str:
    """The first `name` field of /proc/cpuinfo ("model name", "vendor_id"), or "" where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
