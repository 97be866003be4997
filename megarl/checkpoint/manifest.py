"""The manifest of a checkpoint directory: every file's relative path, size and CRC-32, written last.

A directory with a manifest was completed; a file whose size or checksum differs from its entry was
truncated or corrupted after the save. `verify_collective` splits the checksum work over the ranks (rank r
reads files i with i % world == r) and gathers every rank's problems, so all ranks fail together with
the same message instead of some of them hanging in the next collective.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from megarl.checkpoint.format import CheckpointError

MANIFEST_FILE = "manifest.json"
_READ_BYTES = 8 << 20


def file_crc32(path: Path) -> str:
    """CRC-32 of a file's bytes as 8 hex digits (zlib's, ≈ 1 GB/s: integrity, not authenticity)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def build_manifest(root: str | Path) -> dict[str, Any]:
    """{"files": [{"path", "size", "crc32"}, ...]} of every file under `root`, sorted by path."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    entries = [
        {"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "crc32": file_crc32(p)}
        for p in files
    ]
    return {"format": "megarl-manifest-1", "checksum": "crc32", "files": entries}


def write_manifest(root: str | Path) -> dict[str, Any]:
    """Write `root/manifest.json` (call once every other file is in place); returns it."""
    manifest = build_manifest(root)
    staging = Path(root) / f"{MANIFEST_FILE}.partial"
    staging.write_text(json.dumps(manifest, indent=1))
    staging.rename(Path(root) / MANIFEST_FILE)
    return manifest


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of `root`; a CheckpointError when it is missing (never completed) or corrupt."""
    path = Path(root) / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{root} has no {MANIFEST_FILE}: the save never completed (the manifest is written last); "
            "resume from an earlier checkpoint"
        )
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if not all({"path", "size", "crc32"} <= set(e) for e in files):
            raise KeyError("path/size/crc32")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is corrupt ({e}); resume from an earlier checkpoint") from None
    return manifest


def check_files(
    root: str | Path, manifest: dict[str, Any], rank: int = 0, world: int = 1, checksums: bool = True
) -> list[str]:
    """Problems of this rank's share of the manifest's files (sizes of all, checksums of every
    `world`-th from `rank`): one line per file naming it and the mismatch; empty when all is well."""
    root = Path(root)
    problems = []
    for i, entry in enumerate(manifest["files"]):
        path = root / entry["path"]
        if not path.is_file():
            problems.append(f"{path} is missing (listed in {MANIFEST_FILE})")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(
                f"{path} is truncated or altered: {size} bytes, {MANIFEST_FILE} says {entry['size']}"
            )
            continue
        if checksums and i % world == rank and (crc := file_crc32(path)) != entry["crc32"]:
            problems.append(
                f"{path} is corrupt: CRC-32 {crc}, {MANIFEST_FILE} says {entry['crc32']} (same size)"
            )
    return problems


def verify_collective(root: str | Path, manifest: dict[str, Any]) -> None:
    """Collective: check every file of the manifest (checksums split over the ranks); every rank raises
    the same CheckpointError listing all problems found anywhere."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = check_files(root, manifest, rank, world)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    problems = list(dict.fromkeys(p for part in everyone for p in part))  # sizes are seen by every rank
    if problems:
        raise CheckpointError(
            f"checkpoint {root} failed verification: "
            + "; ".join(problems)
            + "; resume from an earlier checkpoint"
        )
