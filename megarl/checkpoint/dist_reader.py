"""Read full (TP=1) tensors, one layer at a time, out of a megatron torch_dist checkpoint, in one process.

A megatron dist-checkpoint (torch_dist backend) is a torch.distributed.checkpoint (DCP) directory whose
keys are megatron's ShardedTensor keys, each stored at its global TP=1 shape: a layer-stacked tensor
`decoder.layers.<suffix>` of shape [num_layers, ...], the padded embedding [padded_vocab, hidden], and so on,
saved as chunks (one per TP shard and layer). DCP's resharding planner, asked for one box of a global
tensor, reads only the stored chunks that overlap it, one chunk in memory at a time. So a layer is read by
asking for box [i:i+1, ...] of every stacked key, without megatron, a model or a process group.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from megarl.distributed.param_kind import ParamKind
from megarl.models.convert import llama
from megarl.models.from_hf import ModelArchitecture

_STACKED = "decoder.layers."
_MODEL_KEYS = (
    "embedding.",
    "decoder.",
    "output_layer.",
)  # anything else (optimizer state, ...) is not weights


class _BoxPlanner(DefaultLoadPlanner):
    """Loads box `offsets[fqn]` (of the destination tensor's size) of each global tensor."""

    def __init__(self, offsets: dict[str, tuple[int, ...]]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self._offsets = offsets

    def create_local_plan(self) -> LoadPlan:
        items = []
        for fqn, dest in self.state_dict.items():
            box = ChunkStorageMetadata(offsets=torch.Size(self._offsets[fqn]), sizes=dest.size())
            items += create_read_items_for_chunk_list(fqn, self.metadata.state_dict_metadata[fqn], [box])
        return LoadPlan(items)

    def lookup_tensor(self, index) -> torch.Tensor:
        return self.state_dict[index.fqn]  # the destination is the box itself, not the global tensor


@dataclass(frozen=True)
class Box:
    """One full megatron tensor as a box of a stored global tensor."""

    name: str  # megatron parameter name with its global layer index
    key: str  # the checkpoint key
    offsets: tuple[int, ...]
    shape: tuple[int, ...]  # of the box; a stacked key's leading layer axis (size 1) is dropped on read
    dtype: torch.dtype
    stacked: bool


class DistCheckpointReader:
    """The tensors of a megatron torch_dist checkpoint directory (`<ckpt>/model`), by box."""

    def __init__(self, model_dir: str | Path):
        self.path = Path(model_dir)
        self._storage = FileSystemReader(str(self.path))
        metadata = self._storage.read_metadata()
        self.tensors: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            key: (tuple(md.size), md.properties.dtype)
            for key, md in metadata.state_dict_metadata.items()
            if isinstance(md, TensorStorageMetadata)
        }

    def read(self, boxes: list[Box]) -> dict[str, torch.Tensor]:
        """The boxes' data by megatron name (one DCP load; one stored chunk in memory at a time)."""
        dest = {b.key: torch.empty(b.shape, dtype=b.dtype) for b in boxes}
        if len(dest) != len(boxes):
            raise ValueError("one read takes at most one box per checkpoint key")
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(
                dest,
                storage_reader=self._storage,
                planner=_BoxPlanner({b.key: b.offsets for b in boxes}),
                no_dist=True,
            )
        return {b.name: dest[b.key].squeeze(0) if b.stacked else dest[b.key] for b in boxes}


def _template_order(key: str) -> int:
    template, _ = llama.split_layer_name(key)
    return list(llama.PARAMS).index(template) if template in llama.PARAMS else len(llama.PARAMS)


def layer_buckets(reader: DistCheckpointReader, arch: ModelArchitecture) -> list[list[Box]]:
    """The checkpoint's weights as read buckets in HF order: the embedding, each layer, then the final
    norm and output layer. Vocabulary padding rows are never read."""
    first, layers, last = [], [[] for _ in range(arch.num_layers)], []
    for key, (shape, dtype) in reader.tensors.items():
        if not key.startswith(_MODEL_KEYS):
            continue
        if key.startswith(_STACKED) and not key[len(_STACKED)].isdigit():
            if shape[0] != arch.num_layers:
                raise ValueError(
                    f"{key} stacks {shape[0]} layers, but config.json has num_hidden_layers={arch.num_layers}"
                )
            suffix, rest = key[len(_STACKED) :], (0,) * (len(shape) - 1)
            for i in range(arch.num_layers):
                name = f"{_STACKED}{i}.{suffix}"
                layers[i].append(Box(name, key, (i, *rest), (1, *shape[1:]), dtype, stacked=True))
            continue
        if key == "output_layer.weight" and arch.tie_embeddings and arch.head == "lm":
            continue  # a copy of the embedding
        entry, _ = llama.param_map(key, arch)  # names a tensor megarl cannot map
        if entry.kind is ParamKind.VOCAB:  # the padded embedding or LM head: only the real rows
            if shape[0] < arch.vocab_size:
                raise ValueError(f"{key} has {shape[0]} rows, fewer than vocab_size={arch.vocab_size}")
            shape = (arch.vocab_size, *shape[1:])
        box = Box(key, key, (0,) * len(shape), shape, dtype, stacked=False)
        _, layer = llama.split_layer_name(key)
        if layer is not None:
            layers[layer].append(box)
        else:
            (first if key.startswith("embedding.") else last).append(box)
    for bucket in layers:
        bucket.sort(key=lambda b: _template_order(b.name))
    last.sort(key=lambda b: b.name != "decoder.final_layernorm.weight")
    return [b for b in [first, *layers, last] if b]


_EXPERT_STACK = ".mlp.experts.experts."  # SequentialMLP's key: one tensor [num_experts, ...] per layer


def _per_expert(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """A layer's stored expert stack as each routed expert's parameter (`local_experts.{e}`, global e);
    any other tensor as it is."""
    if _EXPERT_STACK not in name:
        yield name, tensor
        return
    for e, expert in enumerate(tensor):
        yield name.replace(_EXPERT_STACK, f".mlp.experts.local_experts.{e}.", 1), expert


def checkpoint_megatron_tensors(
    reader: DistCheckpointReader, arch: ModelArchitecture, meta: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full (TP=1) megatron tensors of the checkpoint, named with global layer indices, read one bucket
    (a layer) at a time; `meta=True` yields meta tensors of the same shapes without reading anything."""
    for bucket in layer_buckets(reader, arch):
        if meta:
            for b in bucket:
                t = torch.empty(b.shape, dtype=b.dtype, device="meta")
                yield from _per_expert(b.name, t.squeeze(0) if b.stacked else t)
            continue
        tensors = reader.read(bucket)
        for b in bucket:
            yield from _per_expert(b.name, tensors.pop(b.name))


def truncated_files(model_dir: str | Path) -> list[str]:
    """One line per data file of the dist-checkpoint `model_dir` that is missing or shorter than its
    metadata's records need (a copy cut short, a full disk): how a checkpoint without a manifest (what
    `megarl convert hf-to-mcore` writes) names its damaged file. Empty when the metadata is unreadable."""
    from megarl.checkpoint.safe_load import no_code_unpickling

    model_dir = Path(model_dir)
    try:
        with no_code_unpickling():
            storage = FileSystemReader(str(model_dir)).read_metadata().storage_data
    except Exception:
        return []
    needed: dict[str, int] = {}
    for info in (storage or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    problems = []
    for name, size in sorted(needed.items()):
        path = model_dir / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif (actual := path.stat().st_size) < size:
            problems.append(f"{path} is truncated: {actual} bytes, its records need {size}")
    return problems
