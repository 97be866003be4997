"""Stream tensors out of and into Hugging Face safetensors checkpoints, one tensor at a time."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open

from megarl.models.convert.safetensors_shards import (
    INDEX_FILE,
    SINGLE_FILE,
    ShardWriter,
    TensorSpec,
    parse_size,
    plan_shards,
    write_index,
)

_NOT_WEIGHTS = {SINGLE_FILE, INDEX_FILE}


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

    def _handle(self, name: str):
        if name not in self._file_of:
            raise KeyError(f"tensor {name!r} is not in the checkpoint at {self.path}")
        file = self._file_of[name]
        if file not in self._handles:
            self._handles[file] = safe_open(file, framework="pt")
        return self._handles[file]

    def get(self, name: str) -> torch.Tensor:
        return self._handle(name).get_tensor(name)

    def describe(self, name: str) -> tuple[tuple[int, ...], str]:
        """(shape, safetensors dtype such as "BF16") of a tensor, without reading it."""
        piece = self._handle(name).get_slice(name)
        return tuple(piece.get_shape()), piece.get_dtype()


def copy_hf_metadata(src: str | Path, dst: str | Path) -> None:
    """Copy config, generation config and tokenizer files (everything but the weights)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in _NOT_WEIGHTS and not f.name.endswith(".safetensors"):
            shutil.copy2(f, dst / f.name)


def write_classifier_config(out_dir: str | Path) -> None:
    """Make `out_dir`'s config.json (a language model's, copied from the source) describe a scalar-head
    model: `<Family>ForSequenceClassification` with one label, which transformers loads with
    `AutoModelForSequenceClassification` (weights `score.weight`) and pools at the last non-pad token —
    so `pad_token_id` is set, from the tokenizer when the config has none."""
    path = Path(out_dir) / "config.json"
    config = json.loads(path.read_text())
    architecture = (config.get("architectures") or [""])[0]
    family = architecture.split("For")[0] if "For" in architecture else config["model_type"].capitalize()
    config["architectures"] = [f"{family}ForSequenceClassification"]
    config["id2label"], config["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    config.pop("num_labels", None)  # transformers derives it from id2label
    if config.get("pad_token_id") is None:
        from transformers import AutoTokenizer

        config["pad_token_id"] = AutoTokenizer.from_pretrained(out_dir).pad_token_id
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_hf_weights(
    out_dir: str | Path, tensors: Iterable[tuple[str, torch.Tensor]], max_shard_size: int | str = "5GB"
) -> None:
    """Write in-memory (name, tensor) pairs as HF safetensors shards of at most `max_shard_size`, plus
    the index when there are several (the streaming writers are in megarl/checkpoint/hf_export.py)."""
    tensors = list(tensors)
    plan = plan_shards([[TensorSpec.of(n, t) for n, t in tensors]], parse_size(max_shard_size))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(out_dir, plan)
    for name, tensor in tensors:
        writer.write(name, tensor)
    writer.close()
    write_index(out_dir, plan)
