"""Put adapters into a built megatron model, find them, and turn them off.

    apply_lora(chunks, arch, cfg, seed)   after the base weights are loaded, before DDP and the optimizer
    lora_params(chunks)                   {global megatron name: parameter} of this rank's adapters
    with adapters_disabled(chunks): ...   the base model, bitwise (the reference policy for free)

Initial adapters do not depend on the layout: each projection's full A is drawn from a generator seeded
by (seed, layer, projection) and this rank keeps its shard; B starts at zero, so the model starts as
its base, exactly.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from megarl.distributed.param_kind import ParamKind
from megarl.models.convert.sharding import shard
from megarl.models.from_hf import ModelArchitecture
from megarl.models.lora.layers import LoraAdapter, add_adapters, lora_linears
from megarl.models.lora.targets import MEGATRON_LINEARS, PROJECTIONS, adapter_tensor, targeted


def _unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _init_a(full: torch.Tensor, method: str, generator: torch.Generator) -> None:
    if method == "kaiming":  # PEFT's default: nn.Linear's init
        torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)
    elif method == "xavier":  # Megatron-Bridge's (verl's lora_A_init_method: xavier)
        torch.nn.init.xavier_uniform_(full, generator=generator)
    else:
        raise ValueError(f"lora.init_A={method!r}; use kaiming or xavier")


def _fused_layout(arch: ModelArchitecture, linear: str, tp: int) -> tuple[list[tuple[str, int]], int]:
    """(projection, local output features) of a fused linear's output, and its query groups per rank."""
    from megarl.models.lora.targets import projection_shape

    names = MEGATRON_LINEARS[linear]
    layout = [(p, projection_shape(arch, p)[0] // tp) for p in names]
    return layout, (arch.num_kv_heads // tp if linear == "linear_qkv" else 0)


@torch.no_grad()
def apply_lora(chunks: list[torch.nn.Module], arch: ModelArchitecture, cfg: Any, seed: int) -> int:
    """Add adapters (cfg: a LoraConfig with rank > 0) to this rank's chunks and freeze everything else
    but a scalar head (a critic's value head is new, so it is trained whole). Returns the number of
    linears that got adapters."""
    from megatron.core import parallel_state

    tp, tp_rank = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_rank(),
    )
    scaling = cfg.alpha / cfg.rank
    qkv = any(
        targeted(cfg, layer, p) for layer in range(arch.num_layers) for p in MEGATRON_LINEARS["linear_qkv"]
    )
    if qkv and tp > arch.num_kv_heads:  # megatron then splits the fused QKV output across query groups
        raise ValueError(
            f"LoRA on q/k/v needs tensor parallelism ≤ the model's {arch.num_kv_heads} key/value heads, not "
            f"tp={tp}; lower tp or add linear_qkv to lora.exclude_modules"
        )
    count = 0
    for chunk in chunks:
        model = _unwrap(chunk)
        model.requires_grad_(False)
        if arch.head == "scalar" and getattr(model, "output_layer", None) is not None:
            model.output_layer.requires_grad_(
                True
            )  # a value head is new: trained whole (PEFT's modules_to_save)
        for layer_module in getattr(model.decoder, "layers", []):
            layer = layer_module.layer_number - 1
            for linear_name, projections in MEGATRON_LINEARS.items():
                chosen = [p for p in projections if targeted(cfg, layer, p)]
                if not chosen:
                    continue
                row = PROJECTIONS[chosen[0]].row_parallel
                linear = layer_module.get_submodule(PROJECTIONS[chosen[0]].megatron)
                weight = linear.weight
                sequence_parallel = bool(getattr(linear, "sequence_parallel", False))
                adapters = {}
                for p in chosen:
                    a, b = (adapter_tensor(arch, cfg.rank, layer, p, part) for part in "AB")
                    full_a = torch.empty(a.shape, dtype=torch.float32)
                    gen = torch.Generator().manual_seed(
                        seed * 1_000_003 + layer * 101 + list(PROJECTIONS).index(p)
                    )
                    _init_a(full_a, cfg.init_A, gen)
                    local_a = shard(a.kind, full_a, tp_rank, tp)
                    local_b_shape = (
                        b.shape if b.kind is ParamKind.REPLICATED else (b.shape[0] // tp, b.shape[1])
                    )
                    adapter = LoraAdapter(
                        a.kind,
                        b.kind,
                        tuple(local_a.shape),
                        local_b_shape,
                        scaling,
                        cfg.dropout,
                        sequence_parallel,
                        weight.dtype,
                        weight.device,
                    )
                    adapter.lora_A.copy_(local_a)
                    adapters[p] = adapter
                layout, groups = ([], 0) if row else _fused_layout(arch, linear_name, tp)
                add_adapters(linear, adapters, row, layout, groups)
                count += 1
    return count


def lora_params(chunks: list[torch.nn.Module]) -> dict[str, torch.nn.Parameter]:
    """This rank's adapter parameters by global megatron name (PP/VPP-safe layer indices)."""
    from megarl.models.convert.loader import global_named_parameters

    return {name: param for chunk in chunks for name, param in global_named_parameters(chunk, adapters=True)}


def has_lora(chunks: list[torch.nn.Module]) -> bool:
    return bool(lora_linears(chunks))


@contextlib.contextmanager
def adapters_disabled(chunks: list[torch.nn.Module]) -> Iterator[None]:
    """The base model inside the block: every adapter's output is left out (not added as zero)."""
    linears = lora_linears(chunks)
    for linear in linears:
        linear.lora_enabled = False
    try:
        yield
    finally:
        for linear in linears:
            linear.lora_enabled = True
