"""The peer trainers' own virtualenvs, created on first use under `outputs/bench/.venv-<peer>`.

A peer never shares megarl's environment: its pins (transformers, accelerate, datasets) would move
ours. torch is pinned to the build megarl runs on so both sides execute the same kernels; the rest
follows the pins below. A venv is reused when its marker file records the same pins.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

PEERS: dict[str, list[str]] = {
    # trl 1.16.0 (2026-11) with the transformers megarl is tested with; torch = megarl's CPU build
    "trl": ["trl==1.16.0", "transformers=={transformers}", "torch=={torch}", "psutil"],
}


PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pins(peer: str) -> list[str]:
    import torch
    import transformers

    return [p.format(transformers=transformers.__version__, torch=torch.__version__) for p in PEERS[peer]]


def peer_python(peer: str, root: Path, log=print) -> Path:
    """The python of `peer`'s venv under `root` (e.g. outputs/bench), created or updated when needed."""
    venv = root / f".venv-{peer}"
    python = venv / "bin" / "python"
    marker = venv / "megarl-pins.json"
    pins = _pins(peer)
    if python.exists() and marker.exists() and json.loads(marker.read_text()) == pins:
        return python
    log(f"bench: creating {venv} for the {peer} peer ({' '.join(pins)}); once, about 2 minutes")
    start = time.perf_counter()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins]
    # pip's own configuration first (a local wheel directory may hold the +cpu torch); PyPI has no +cpu
    # builds, so PyTorch's index only when that fails: where it is unreachable, pip would wait on it
    done = subprocess.run(pip, capture_output=True, text=True)
    if done.returncode != 0 and any("+cpu" in p for p in pins):
        done = subprocess.run([*pip, "--extra-index-url", PYTORCH_CPU_INDEX], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"bench: installing the {peer} peer into {venv} failed (pip exit {done.returncode}):\n"
            f"{done.stderr[-3000:]}\nFix the network/pins and rerun; delete {venv} to start over."
        )
    marker.write_text(json.dumps(pins))
    log(f"bench: {venv} ready in {time.perf_counter() - start:.0f}s")
    return python
