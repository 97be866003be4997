"""One rank's random-number state as JSON + safetensors (no pickle): save it, restore it bit-exactly.

    rng/rank_<r>.json          python `random`, numpy's legacy global generator, the layout it belongs to,
                               and a worker's extra counters (JSON values)
    rng/rank_<r>.safetensors   torch's CPU generator, every CUDA device's (when present), megatron's
                               model-parallel RNG-tracker states, and the worker's extra tensors

Random state only means something on the rank and layout that made it: a loader restores it only when
the layout is the saved one (`same_layout`), and otherwise leaves the fresh seeding in place.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from megarl.checkpoint.format import CheckpointError

RNG_DIR = "rng"
_TRACKER, _EXTRA, _CUDA = "tracker.", "extra.", "cuda."


def rank_files(role_dir: str | Path, rank: int) -> tuple[Path, Path]:
    base = Path(role_dir) / RNG_DIR / f"rank_{rank}"
    return base.with_suffix(".json"), base.with_suffix(".safetensors")


def capture(extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """This process's RNG states (+ `extra`: JSON values or tensors) as (JSON dict, tensors)."""
    from megatron.core import tensor_parallel

    info: dict[str, Any] = {**python_numpy_state(), "extra": {}}
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors |= {f"{_CUDA}{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())}
    for name, s in tensor_parallel.get_cuda_rng_tracker().get_states().items():
        tensors[_TRACKER + name] = s.cpu()
    for key, value in (extra or {}).items():
        if isinstance(value, torch.Tensor):
            tensors[_EXTRA + key] = value.cpu()
        else:
            info["extra"][key] = value
    return info, {k: v.contiguous() for k, v in tensors.items()}


def restore(info: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Put the captured states back; returns the extra entries (tensors and JSON values merged)."""
    from megatron.core import tensor_parallel

    restore_python_numpy(info)
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted((k for k in tensors if k.startswith(_CUDA)), key=lambda k: int(k[len(_CUDA) :]))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    tracker = {k[len(_TRACKER) :]: v for k, v in tensors.items() if k.startswith(_TRACKER)}
    if tracker:
        tensor_parallel.get_cuda_rng_tracker().set_states(tracker)
    extra = dict(info.get("extra", {}))
    extra |= {k[len(_EXTRA) :]: v for k, v in tensors.items() if k.startswith(_EXTRA)}
    return extra


def python_numpy_state() -> dict[str, Any]:
    """Python's `random` and numpy's legacy global generator, as JSON values."""
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(state), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def restore_python_numpy(info: dict[str, Any]) -> None:
    version, state, gauss = info["python"]
    random.setstate((version, tuple(state), gauss))
    kind, keys, pos, has_gauss, cached = info["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def write_rank_state(
    role_dir: str | Path, rank: int, layout: dict[str, Any], extra: dict[str, Any] | None = None
) -> list[Path]:
    """Write this rank's RNG state and `extra` for `layout` (the saving layout's sizes); the files."""
    info, tensors = capture(extra)
    info["layout"] = layout
    json_file, tensor_file = rank_files(role_dir, rank)
    json_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, tensor_file, metadata={"format": "megarl-rng-1"})
    json_file.write_text(json.dumps(info))
    return [json_file, tensor_file]


def read_rank_state(role_dir: str | Path, rank: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The (JSON dict, tensors) rank `rank` saved; a CheckpointError naming the file when unreadable."""
    json_file, tensor_file = rank_files(role_dir, rank)
    try:
        info = json.loads(json_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{json_file} is missing: the checkpoint has no RNG state for rank {rank}"
        ) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{json_file} is corrupt ({e})") from None
    try:
        tensors = load_file(tensor_file)
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{tensor_file} is unreadable ({e})") from None
    return info, tensors


def layout_of(layout) -> dict[str, Any]:
    """The sizes that make RNG state rank-specific (a ParallelLayout's)."""
    return {
        "world_size": layout.world_size,
        "tp": layout.tp,
        "pp": layout.pp,
        "dp": layout.dp,
        "cp": layout.cp,
        "ep": layout.ep,
        "vpp": layout.vpp,
        "sequence_parallel": layout.sequence_parallel,
    }
