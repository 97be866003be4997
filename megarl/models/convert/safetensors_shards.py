"""Size-bounded safetensors shards written tensor by tensor, in Hugging Face's layout.

The shards are planned from the tensors' names, shapes and dtypes before any data exists (the
converters compute them on the meta device), so each file's header is written first and every tensor's
bytes go straight to its offset: memory holds one tensor at a time, however large the shard.

Files: one shard is `model.safetensors`; K > 1 shards are `model-0000i-of-0000K.safetensors` plus
`model.safetensors.index.json` = {"metadata": {"total_parameters", "total_size"}, "weight_map"}, as
`save_pretrained` writes them. Planning in groups keeps every shard inside one group, so several
writers (one per pipeline stage) each write whole files of their own.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DEFAULT_MAX_SHARD_SIZE = "5GB"
_METADATA = {"format": "pt"}

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(size: int | str) -> int:
    """'5GB' -> 5_000_000_000, '500MB', '2GiB', or a plain number of bytes (decimal units, like HF)."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B)?\s*", size.upper())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"size {size!r} is not a positive size like '5GB', '500MB', '2GiB' or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, tuple(tensor.shape), tensor.dtype)

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * self.dtype.itemsize


@dataclass
class Shard:
    file: str
    group: int
    tensors: list[TensorSpec] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass
class ShardPlan:
    shards: list[Shard]

    def weight_map(self) -> dict[str, str]:
        return {t.name: s.file for s in self.shards for t in s.tensors}

    def index(self) -> dict:
        specs = [t for s in self.shards for t in s.tensors]
        total_parameters = sum(t.nbytes // t.dtype.itemsize for t in specs)
        return {
            "metadata": {"total_parameters": total_parameters, "total_size": sum(t.nbytes for t in specs)},
            "weight_map": dict(sorted(self.weight_map().items())),
        }


def plan_shards(groups: Sequence[Sequence[TensorSpec]], max_shard_bytes: int) -> ShardPlan:
    """Pack each group's tensors, in order, into shards of at most `max_shard_bytes` (a larger tensor
    gets a shard of its own); shards never mix groups."""
    shards: list[Shard] = []
    seen: set[str] = set()
    for g, specs in enumerate(groups):
        current: Shard | None = None
        for spec in specs:
            if spec.name in seen:
                raise ValueError(f"tensor {spec.name!r} appears twice")
            seen.add(spec.name)
            if current is None or (current.tensors and current.nbytes + spec.nbytes > max_shard_bytes):
                current = Shard("", g)
                shards.append(current)
            current.tensors.append(spec)
    total = len(shards)
    for i, shard in enumerate(shards, 1):
        shard.file = SINGLE_FILE if total == 1 else f"model-{i:05d}-of-{total:05d}.safetensors"
    return ShardPlan(shards)


def _header(shard: Shard) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The file's header bytes and each tensor's [begin, end) in the data area. Wider dtypes first keep
    every tensor aligned to its element size (as safetensors itself orders them)."""
    header: dict = {"__metadata__": _METADATA}
    offsets = {}
    pos = 0
    for spec in sorted(shard.tensors, key=lambda t: -t.dtype.itemsize):
        if spec.dtype not in _DTYPES:
            raise ValueError(f"{spec.name}: dtype {spec.dtype} has no safetensors name")
        offsets[spec.name] = (pos, pos + spec.nbytes)
        header[spec.name] = {
            "dtype": _DTYPES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [pos, pos + spec.nbytes],
        }
        pos += spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data area starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text, offsets


class ShardWriter:
    """Writes the shards of one plan group; `write` takes the group's tensors in any order.

    Each file is opened when its first tensor arrives and closed when its last has been written, so a
    crash leaves only files that `close` would refuse to call complete (the caller stages the directory).
    """

    def __init__(self, out_dir: str | Path, plan: ShardPlan, group: int = 0):
        self.out_dir = Path(out_dir)
        self._shard_of: dict[str, Shard] = {}
        self._pending: dict[str, set[str]] = {}
        for shard in plan.shards:
            if shard.group == group:
                self._shard_of.update((t.name, shard) for t in shard.tensors)
                self._pending[shard.file] = {t.name for t in shard.tensors}
        self._open: dict[str, tuple[object, int, dict[str, tuple[int, int]]]] = {}
        self._specs = {t.name: t for s in plan.shards if s.group == group for t in s.tensors}

    def write(self, name: str, tensor: torch.Tensor) -> None:
        spec = self._specs.get(name)
        if spec is None:
            raise KeyError(f"tensor {name!r} is not planned for this writer")
        if TensorSpec.of(name, tensor) != spec:
            raise ValueError(
                f"{name}: got {tuple(tensor.shape)} {tensor.dtype}, planned {spec.shape} {spec.dtype}"
            )
        shard = self._shard_of[name]
        if name not in self._pending[shard.file]:
            raise ValueError(f"tensor {name!r} written twice")
        if shard.file not in self._open:
            header, offsets = _header(shard)
            f = open(self.out_dir / shard.file, "wb")  # noqa: SIM115 (closed when the shard is full)
            f.write(header)
            f.truncate(len(header) + shard.nbytes)
            self._open[shard.file] = (f, len(header), offsets)
        f, start, offsets = self._open[shard.file]
        f.seek(start + offsets[name][0])
        data = tensor.detach().cpu().contiguous().reshape(-1)
        f.write(data.view(torch.uint8).numpy().data if data.numel() else b"")
        self._pending[shard.file].discard(name)
        if not self._pending[shard.file]:
            f.close()
            del self._open[shard.file]

    def close(self) -> None:
        """Check that every planned tensor arrived (and close any file left open)."""
        for f, _, _ in self._open.values():
            f.close()
        self._open.clear()
        missing = sorted(n for names in self._pending.values() for n in names)
        if missing:
            raise ValueError(f"{len(missing)} planned tensor(s) never arrived, e.g. {missing[:3]}")


def write_index(out_dir: str | Path, plan: ShardPlan) -> None:
    """`model.safetensors.index.json` when the plan has more than one shard (HF's exact format)."""
    if len(plan.shards) > 1:
        text = json.dumps(plan.index(), indent=2, sort_keys=True) + "\n"
        (Path(out_dir) / INDEX_FILE).write_text(text)
