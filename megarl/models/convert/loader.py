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
    """named_parameters with the local layer index replaced by the global one (PP/VPP-safe), and a local
    expert's index by its global one (EP-safe): the base model's, or with `adapters=True` only the LoRA
    adapters' (`megarl.models.lora`)."""
    model = _unwrap(chunk)
    for name, param in model.named_parameters():
        if (".lora." in name) != adapters:
            continue
        template, local = llama.split_layer_name(name)
        if local is None:
            yield name, param
            continue
        layer = model.decoder.layers[local]
        _, expert = llama.split_expert_name(template)
        if expert is not None:
            name = name.replace(
                f".local_experts.{expert}.", f".local_experts.{layer.mlp.local_expert_indices[expert]}.", 1
            )
        yield name.replace(f"decoder.layers.{local}.", f"decoder.layers.{layer.layer_number - 1}.", 1), param


def _expert_tp() -> tuple[int, int]:
    """(rank, size) in the expert-tensor-parallel group, which splits each routed expert."""
    from megatron.core import parallel_state as ps

    return ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()


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
                rank, size = _expert_tp() if entry.expert else (tp_rank, tp)
                local = shard(entry.kind, full, rank, size, padded_rows=param.shape[0] * size)
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
    """Full (TP-gathered) parameters, or their gradients, of this rank's PP stage (a TP collective); with
    expert parallelism every expert of the stage, gathered over the expert-parallel group too."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp, tp_group = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_group()
    ep = ps.get_expert_model_parallel_world_size()
    for chunk in chunks:
        for name, param in global_named_parameters(chunk):
            if getattr(param, "shared", False):
                continue  # the last stage's copy of tied embeddings
            entry, _ = llama.param_map(name, arch)
            local = (getattr(param, "main_grad", param.grad) if grads else param).detach().contiguous()
            size, group = (
                (_expert_tp()[1], ps.get_expert_tensor_parallel_group()) if entry.expert else (tp, tp_group)
            )
            shards = [local]
            if size > 1 and entry.kind.tp_sharded:
                shards = [torch.empty_like(local) for _ in range(size)]
                dist.all_gather(shards, local, group=group)
            full = unshard(entry.kind, shards, vocab_size=arch.vocab_size)
            if not entry.expert or ep == 1:
                yield name, full
                continue
            peers = [torch.empty_like(full) for _ in range(ep)]
            dist.all_gather(peers, full, group=ps.get_expert_model_parallel_group())
            yield from zip(expert_peer_names(name, arch, ep), peers)


def expert_peer_names(name: str, arch: ModelArchitecture, ep: int) -> list[str]:
    """A routed expert parameter's name on every EP rank, in EP rank order: the same local expert l of
    each rank, global experts r·(num_experts/ep) + l."""
    template, expert = llama.split_expert_name(name)
    per_rank = arch.num_experts // ep
    return [template.format(e=per_rank * r + expert % per_rank) for r in range(ep)]


def to_hf_tensors(
    megatron_tensors: Iterator[tuple[str, torch.Tensor]], arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full megatron tensors -> HF (name, tensor) pairs."""
    for name, full in megatron_tensors:
        entry, hf_names = llama.param_map(name, arch)
        if name == "output_layer.weight" and arch.tie_embeddings and arch.head == "lm":
            continue
        yield from zip(hf_names, llama.split(entry, full, arch))
