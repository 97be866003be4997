"""Load HF weights into this rank's megatron chunks, and read full HF tensors back out of them."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from megarl.models.convert import llama
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.sharding import shard, unshard
from megarl.models.from_hf import ModelArchitecture


def _unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def global_named_parameters(
    chunk: torch.nn.Module, adapters: bool = False
) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """named_parameters with the local layer index replaced by the global one (PP/VPP-safe): the base
    model's, or with `adapters=True` only the LoRA adapters' (`megarl.models.lora`)."""
    model = _unwrap(chunk)
    for name, param in model.named_parameters():
        if (".lora." in name) != adapters:
            continue
        template, local = llama.split_layer_name(name)
        if local is not None:
            name = name.replace(
                f"decoder.layers.{local}.",
                f"decoder.layers.{model.decoder.layers[local].layer_number - 1}.",
                1,
            )
        yield name, param


def load_hf_into_chunks(
    chunks: list[torch.nn.Module], arch: ModelArchitecture, reader: HFCheckpointReader, tp_rank: int, tp: int
) -> int:
    """Copy HF tensors into every parameter of `chunks` (streaming); returns the count loaded.

    A scalar head missing from the checkpoint (a critic started from a policy LM) keeps its init.
    """
    loaded = 0
    available = set(reader.names())
    with torch.no_grad():
        for chunk in chunks:
            for name, param in global_named_parameters(chunk):
                entry, hf_names = llama.param_map(name, arch)
                if entry is llama.SCALAR_HEAD and not available.issuperset(hf_names):
                    continue
                full = llama.merge(entry, [reader.get(n) for n in hf_names], arch)
                local = shard(entry.kind, full, tp_rank, tp, padded_rows=param.shape[0] * tp)
                if local.shape != param.shape:
                    raise ValueError(
                        f"{name}: HF tensors {hf_names} give a TP shard of shape {tuple(local.shape)}, "
                        f"but the megatron parameter has shape {tuple(param.shape)}; does config.json match the weights?"
                    )
                param.copy_(local)
                loaded += 1
    return loaded


def full_megatron_tensors(
    chunks: list[torch.nn.Module], arch: ModelArchitecture, grads: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full (TP-gathered) parameters, or their gradients, of this rank's PP stage (a TP collective)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    group = parallel_state.get_tensor_model_parallel_group()
    for chunk in chunks:
        for name, param in global_named_parameters(chunk):
            if getattr(param, "shared", False):
                continue  # the last stage's copy of tied embeddings
            entry, _ = llama.param_map(name, arch)
            local = (getattr(param, "main_grad", param.grad) if grads else param).detach()
            shards = [local]
            if tp > 1 and entry.kind.tp_sharded:
                shards = [torch.empty_like(local) for _ in range(tp)]
                dist.all_gather(shards, local.contiguous(), group=group)
            yield name, unshard(entry.kind, shards, vocab_size=arch.vocab_size)


def to_hf_tensors(
    megatron_tensors: Iterator[tuple[str, torch.Tensor]], arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full megatron tensors -> HF (name, tensor) pairs."""
    for name, full in megatron_tensors:
        entry, hf_names = llama.param_map(name, arch)
        if name == "output_layer.weight" and arch.tie_embeddings and arch.head == "lm":
            continue
        yield from zip(hf_names, llama.split(entry, full, arch))
