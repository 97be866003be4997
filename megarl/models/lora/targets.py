"""Which projections carry an adapter, and every adapter tensor's names, full shape and TP layout (pure).

A projection is one HF linear (q_proj … down_proj). Its adapter is lora_A [r, in] and lora_B [out, r]:
in a column-parallel projection (q, k, v, gate, up) B is split by output rows and A is whole on every TP
rank; in a row-parallel one (o, down) A is split by input columns and B is whole — the layout megatron's
linear has, so the adapter needs no communication of its own beyond the linear's.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from megarl.config.schema_lora import ALL_LINEAR, MEGATRON_LINEARS
from megarl.config.schema_lora import PROJECTIONS as PROJECTION_NAMES
from megarl.distributed.param_kind import ParamKind
from megarl.models.from_hf import ModelArchitecture


@dataclass(frozen=True)
class Projection:
    megatron: str  # the megatron linear holding it, inside a layer
    hf: str  # the HF module inside a layer
    row_parallel: bool


PROJECTIONS: dict[str, Projection] = {
    "q_proj": Projection("self_attention.linear_qkv", "self_attn.q_proj", False),
    "k_proj": Projection("self_attention.linear_qkv", "self_attn.k_proj", False),
    "v_proj": Projection("self_attention.linear_qkv", "self_attn.v_proj", False),
    "o_proj": Projection("self_attention.linear_proj", "self_attn.o_proj", True),
    "gate_proj": Projection("mlp.linear_fc1", "mlp.gate_proj", False),
    "up_proj": Projection("mlp.linear_fc1", "mlp.up_proj", False),
    "down_proj": Projection("mlp.linear_fc2", "mlp.down_proj", True),
}
assert tuple(PROJECTIONS) == PROJECTION_NAMES  # the names users write (megarl.config.schema_lora)
PEFT_PREFIX = "base_model.model."


def _matches(entry: str, layer: int, projection: str) -> bool:
    if entry == ALL_LINEAR:
        return True
    if entry in PROJECTIONS:
        return entry == projection
    if entry in MEGATRON_LINEARS:
        return projection in MEGATRON_LINEARS[entry]
    p = PROJECTIONS[projection]
    names = (f"model.layers.{layer}.{p.hf}", f"decoder.layers.{layer}.{p.megatron}")
    return any(fnmatch.fnmatchcase(name, entry) for name in names)


def _entries(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def targeted(cfg: Any, layer: int, projection: str) -> bool:
    """Whether `projection` of `layer` gets an adapter under cfg.target_modules / cfg.exclude_modules."""
    targets, excludes = _entries(cfg.target_modules), _entries(cfg.exclude_modules)
    return any(_matches(e, layer, projection) for e in targets) and not any(
        _matches(e, layer, projection) for e in excludes
    )


def projection_shape(arch: ModelArchitecture, projection: str) -> tuple[int, int]:
    """(out, in) features of a projection's full HF weight."""
    d, h, f = arch.head_dim, arch.hidden_size, arch.ffn_hidden_size
    return {
        "q_proj": (arch.num_heads * d, h),
        "k_proj": (arch.num_kv_heads * d, h),
        "v_proj": (arch.num_kv_heads * d, h),
        "o_proj": (h, arch.num_heads * d),
        "gate_proj": (f, h),
        "up_proj": (f, h),
        "down_proj": (h, f),
    }[projection]


@dataclass(frozen=True)
class LoraTensor:
    megatron: str  # global megatron name, e.g. decoder.layers.3.self_attention.linear_qkv.lora.q_proj.lora_A
    peft: str  # PEFT's saved name, e.g. base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
    kind: ParamKind  # its TP layout
    layer: int
    projection: str
    part: str  # "A" | "B"
    shape: tuple[int, int]  # full (TP=1) shape


def adapter_tensor(arch: ModelArchitecture, rank: int, layer: int, projection: str, part: str) -> LoraTensor:
    p = PROJECTIONS[projection]
    out, inp = projection_shape(arch, projection)
    if part == "A":
        kind = ParamKind.ROW if p.row_parallel else ParamKind.REPLICATED
        shape = (rank, inp)
    else:
        kind = ParamKind.REPLICATED if p.row_parallel else ParamKind.COLUMN
        shape = (out, rank)
    return LoraTensor(
        megatron=f"decoder.layers.{layer}.{p.megatron}.lora.{projection}.lora_{part}",
        peft=f"{PEFT_PREFIX}model.layers.{layer}.{p.hf}.lora_{part}.weight",
        kind=kind,
        layer=layer,
        projection=projection,
        part=part,
        shape=shape,
    )


def lora_tensors(arch: ModelArchitecture, cfg: Any) -> list[LoraTensor]:
    """Every adapter tensor of the model under `cfg` (a LoraConfig), in one global order: by layer, then
    projection, A before B."""
    return [
        adapter_tensor(arch, cfg.rank, layer, projection, part)
        for layer in range(arch.num_layers)
        for projection in PROJECTIONS
        if targeted(cfg, layer, projection)
        for part in ("A", "B")
    ]


def megatron_to_peft(name: str, arch: ModelArchitecture, rank: int) -> LoraTensor:
    """The LoraTensor of a global megatron adapter name."""
    parts = name.split(".")
    layer, projection, part = int(parts[2]), parts[-2], parts[-1][-1]
    return adapter_tensor(arch, rank, layer, projection, part)
