"""Stream tensors out of and into Hugging Face safetensors checkpoints, one tensor at a time."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

_NOT_WEIGHTS = {"model.safetensors", "model.safetensors.index.json"}


class HFCheckpointReader:
    """Lazy reader over `model.safetensors` or a sharded `model.safetensors.index.json`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        single = self.path / "model.safetensors"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._file_of = {name: self.path / f for name, f in weight_map.items()}
        elif single.is_file():
            with safe_open(single, framework="pt") as f:
                self._file_of = {name: single for name in f.keys()}
        else:
            raise FileNotFoundError(
                f"no model.safetensors or model.safetensors.index.json in {self.path}: "
                "megarl reads safetensors checkpoints (save with save_pretrained(safe_serialization=True))"
            )
        self._handles: dict[Path, object] = {}

    def names(self) -> list[str]:
        return list(self._file_of)

    def get(self, name: str) -> torch.Tensor:
        if name not in self._file_of:
            raise KeyError(f"tensor {name!r} is not in the checkpoint at {self.path}")
        file = self._file_of[name]
        if file not in self._handles:
            self._handles[file] = safe_open(file, framework="pt")
        return self._handles[file].get_tensor(name)


def copy_hf_metadata(src: str | Path, dst: str | Path) -> None:
    """Copy config, generation config and tokenizer files (everything but the weights)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in _NOT_WEIGHTS and not f.name.endswith(".safetensors"):
            shutil.copy2(f, dst / f.name)


def write_hf_weights(
    out_dir: str | Path, tensors: Iterable[tuple[str, torch.Tensor]], shard_bytes: int = 2 * 2**30
) -> None:
    """Write (name, tensor) pairs as safetensors shards of at most `shard_bytes`, plus the index."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.detach().contiguous().clone()
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], out_dir / "model.safetensors", metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out_dir / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for s in shards for t in s.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
