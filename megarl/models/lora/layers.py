"""The adapters and the megatron linears that carry them.

`add_adapters(linear, adapters)` gives a built Column/RowParallelLinear its adapters and swaps its class
for a subclass of its own class (`lora_class`) whose forward adds the adapters' output; the base weight
keeps its name, so conversion tables, resharding and checkpoints of the base are unchanged.

Tensor parallelism, with x the linear's input and s = alpha / r:
- column-parallel (q, k, v, gate, up): h = A·x on every TP rank; B holds this rank's output rows, so
  y_local = s·B_local·h. The backward of h is all-reduced over TP (megatron's copy-to-TP region), giving
  A its full gradient on every rank. With sequence parallelism x is first gathered over the sequence
  like the base's input, and A is marked `sequence_parallel` so megatron's finalize_model_grads sums
  its gradient over TP instead.
- row-parallel (o, down): A holds this rank's input columns; h = A_local·x_local is summed over TP
  (reduce-scattered over the sequence with SP, B then marked `sequence_parallel`); y = s·B·h.
The outputs of a fused linear's adapters are laid out as its own output: q/k/v grouped per query group,
fc1 as [gate_local; up_local]. Transformer Engine's LayerNorm-fused linears (GPU) normalize their input
inside; the adapters apply the same norm first (`_normed`; written for TE's attribute names, not yet run
on a GPU).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel import mappings
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from megarl.distributed.param_kind import ParamKind


class LoraAdapter(torch.nn.Module):
    """One projection's lora_A [r, in_local] and lora_B [out_local, r] (this TP rank's shards)."""

    def __init__(
        self,
        a_kind: ParamKind,
        b_kind: ParamKind,
        a_shape: tuple[int, int],
        b_shape: tuple[int, int],
        scaling: float,
        dropout: float,
        sequence_parallel: bool,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.a_kind, self.b_kind, self.scaling = a_kind, b_kind, scaling
        self.lora_A = torch.nn.Parameter(torch.zeros(a_shape, dtype=dtype, device=device))
        self.lora_B = torch.nn.Parameter(torch.zeros(b_shape, dtype=dtype, device=device))
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        for param, kind in ((self.lora_A, a_kind), (self.lora_B, b_kind)):
            if kind is ParamKind.REPLICATED:
                # its gradient is partial per TP rank only when the ranks see different tokens (SP)
                param.sequence_parallel = sequence_parallel
            else:
                set_tensor_model_parallel_attributes(param, True, 0 if kind is ParamKind.COLUMN else 1, 1)


def _normed(linear: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input the linear's weight multiplies: Transformer Engine's LayerNorm-fused linears (the qkv
    and fc1 of megatron's TE spec) take the un-normalized hidden states and normalize them inside, so the
    adapters apply the same norm (its weights frozen) first."""
    weight = getattr(linear, "layer_norm_weight", None)
    if weight is None:
        return x
    if getattr(linear, "zero_centered_gamma", False):
        weight = weight + 1
    shape, x32, w32 = (x.shape[-1],), x.float(), weight.float()  # in fp32, as TE normalizes
    if getattr(linear, "normalization", "LayerNorm") == "RMSNorm":
        return F.rms_norm(x32, shape, w32, linear.eps).to(x.dtype)
    bias = getattr(linear, "layer_norm_bias", None)
    return F.layer_norm(x32, shape, w32, None if bias is None else bias.float(), linear.eps).to(x.dtype)


def _column_delta(linear: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    sp = linear.sequence_parallel
    if sp:
        x = mappings.gather_from_sequence_parallel_region(x, group=linear.tp_group)
    x = _normed(linear, x)
    adapters = list(linear.lora.values())
    if all(isinstance(a.dropout, torch.nn.Identity) for a in adapters):
        # one GEMM for the A's of a fused linear (q, k, v; gate, up): they read the same input
        a = adapters[0].lora_A if len(adapters) == 1 else torch.cat([a.lora_A for a in adapters])
        h = F.linear(x, a)
        if not sp:
            h = mappings.copy_to_tensor_model_parallel_region(h, group=linear.tp_group)
        hs = h.split([a.lora_A.shape[0] for a in adapters], dim=-1)
    else:
        hs = [F.linear(a.dropout(x), a.lora_A) for a in adapters]
        if not sp:
            hs = [mappings.copy_to_tensor_model_parallel_region(h, group=linear.tp_group) for h in hs]
    return [F.linear(h * a.scaling, a.lora_B) for a, h in zip(adapters, hs)]


def _row_delta(linear: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    (adapter,) = linear.lora.values()
    h = F.linear(adapter.dropout(x), adapter.lora_A)
    if linear.sequence_parallel:
        h = mappings.reduce_scatter_to_sequence_parallel_region(h, group=linear.tp_group)
    else:
        h = mappings.reduce_from_tensor_model_parallel_region(h, group=linear.tp_group)
    return F.linear(h * adapter.scaling, adapter.lora_B)


def assemble(linear: torch.nn.Module, outs: list[torch.Tensor]) -> torch.Tensor:
    """The adapters' outputs (one per projection of `linear.lora`, last dim = that projection's local
    output features) laid out as the fused linear's output; zeros for its projections without one."""
    layout = linear.lora_layout  # [(projection, local out features)] of the whole fused output
    by_name = dict(zip(linear.lora.keys(), outs))
    ref = outs[0]
    parts = [by_name.get(p, ref.new_zeros(*ref.shape[:-1], n)) for p, n in layout]
    if linear.lora_groups:  # q/k/v interleaved per query group
        g = linear.lora_groups
        parts = [p.reshape(*p.shape[:-1], g, p.shape[-1] // g) for p in parts]
        return torch.cat(parts, dim=-1).reshape(*ref.shape[:-1], -1)
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def lora_delta(linear: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the adapters add to `linear`'s output for input `x`."""
    if linear.lora_row_parallel:
        return _row_delta(linear, x)
    return assemble(linear, _column_delta(linear, x))


@functools.cache
def lora_class(base: type) -> type:
    """`base` (a megatron Column/RowParallelLinear class) with its adapters' output added."""

    def forward(self, input_, *args, **kwargs):
        output, bias = base.forward(self, input_, *args, **kwargs)
        if self.lora_enabled:
            output = output + lora_delta(self, input_)
        return output, bias

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        axes = {"weight": 1} if self.lora_row_parallel else {"weight": 0, "bias": 0}
        for name, adapter in self.lora.items():
            for part in ("A", "B"):
                kind = getattr(adapter, f"{part.lower()}_kind")
                if kind is not ParamKind.REPLICATED:
                    axes[f"lora.{name}.lora_{part}"] = 0 if kind is ParamKind.COLUMN else 1
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            axes,
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=(metadata or {}).get("dp_cp_group")
            or parallel_state.get_data_parallel_group(with_context_parallel=True),
        )

    return type(
        f"Lora{base.__name__}", (base,), {"forward": forward, "sharded_state_dict": sharded_state_dict}
    )


def add_adapters(
    linear: torch.nn.Module,
    adapters: dict[str, LoraAdapter],
    row_parallel: bool,
    layout: list[tuple[str, int]],
    groups: int = 0,
) -> None:
    """Give `linear` its adapters (`layout`: every projection of its output with its local features, in
    output order; `groups`: query groups on this rank for a fused QKV, else 0)."""
    linear.lora = torch.nn.ModuleDict(adapters)
    linear.lora_row_parallel = row_parallel
    linear.lora_layout = layout
    linear.lora_groups = groups
    linear.lora_enabled = True
    linear.__class__ = lora_class(type(linear))


def lora_linears(chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Every linear of `chunks` that carries adapters."""
    return [
        m
        for chunk in chunks
        for m in chunk.modules()
        if isinstance(getattr(m, "lora", None), torch.nn.ModuleDict)
    ]
