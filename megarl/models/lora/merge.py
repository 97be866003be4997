"""Adapters folded into base weights: W' = W + (alpha / r)·B·A.

merged_weight(linear)            a LoRA linear's merged weight shard, in megatron's local layout
merge_into_hf(weights, adapter)  merged HF tensors for the projections an adapter targets
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from megarl.models.lora.layers import assemble


@torch.no_grad()
def merged_weight(linear: torch.nn.Module) -> torch.Tensor:
    """`linear.weight` (this TP rank's shard) plus its adapters' product, as a new tensor."""
    if linear.lora_row_parallel:
        (adapter,) = linear.lora.values()
        delta = adapter.lora_B @ adapter.lora_A * adapter.scaling
    else:  # each projection's [out_local, in] rows, placed as the fused output's rows
        rows = [(a.lora_B @ a.lora_A * a.scaling).t() for a in linear.lora.values()]
        delta = assemble(linear, rows).t()
    return linear.weight.detach() + delta.to(linear.weight.dtype)


def merge_into_hf(
    weights: Iterable[tuple[str, torch.Tensor]], adapter: dict[str, torch.Tensor], cfg: Any
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF (name, full tensor) pairs with every targeted projection's weight merged (`adapter`: PEFT
    names → full tensors, `cfg.alpha / cfg.rank` the scaling); other tensors pass through."""
    scaling = cfg.alpha / cfg.rank
    for name, tensor in weights:
        module = name.removesuffix(".weight")
        a = adapter.get(f"base_model.model.{module}.lora_A.weight")
        if a is None or not name.endswith(".weight"):
            yield name, tensor
            continue
        b = adapter[f"base_model.model.{module}.lora_B.weight"]
        yield name, (tensor.double() + scaling * (b.double() @ a.double())).to(tensor.dtype)
