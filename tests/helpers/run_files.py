"""Read a run directory's metric files back: metrics.jsonl, TensorBoard events, the wandb offline log,
and the report's PNGs (shared by the unit tests of the backends and the e2e trainer tests)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest


def jsonl_history(out_dir: Path) -> dict[int, dict]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r.pop("step"): r for r in records}


def tensorboard_history(log_dir: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    out: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            out.setdefault(event.step, {})[tag] = event.value
    return out


def wandb_history(out_dir: Path) -> dict[int, dict[str, float]]:
    """The history records of the one wandb run under `out_dir`, from its `run-*.wandb` transaction log
    (a leveldb-style log: 32 KiB blocks of CRC32 | length | type records, after a 7-byte file header)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = out_dir.glob("wandb/*run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    history = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return history


def assert_same_as_jsonl(history: dict[int, dict[str, float]], jsonl: dict[int, dict], rel: float) -> None:
    assert sorted(history) == sorted(jsonl)
    for step, record in jsonl.items():
        assert sorted(history[step]) == sorted(record), f"step {step}"
        for key, value in record.items():
            expected, got = float(value), float(history[step][key])  # "nan" / "inf" strings in jsonl
            if math.isnan(expected):
                assert math.isnan(got), (step, key)
            else:
                assert got == pytest.approx(expected, rel=rel), (step, key)


def image_stats(path: Path) -> tuple[tuple[int, int], int, float]:
    """(width, height), distinct colours and the std of the gray pixel values of a PNG."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB")).astype(np.int32)
    colors = len(np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]))
    return (rgb.shape[1], rgb.shape[0]), colors, float(rgb.mean(axis=2).std())
