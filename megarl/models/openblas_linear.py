"""Megatron's Column/RowParallelLinear multiplying through OpenBLAS (`models/cpu_gemm.py`).

They are megatron's classes with one method changed: `_forward_impl`, the linear-function call each
layer's forward makes (parameters, TP communication, state dict and checkpoints stay megatron's).
Calls `cpu_gemm.covers` go to `cpu_gemm.linear`, every other one to megatron's own function. The CPU
spec provider (`models/backends.py`) puts them in the layer spec where `openblas_chosen()`.
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel import layers

from megarl.models import cpu_gemm


class _OpenBlasForward:
    def _forward_impl(
        self,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        gradient_accumulation_fusion: bool,
        allreduce_dgrad: bool,
        sequence_parallel: bool,
        grad_output_buffer=None,
        tp_group=None,
        **kwargs,
    ) -> torch.Tensor:
        trainable = weight.requires_grad  # megatron's test between its trainable and frozen functions
        fused_wgrad = trainable and gradient_accumulation_fusion
        if grad_output_buffer is None and cpu_gemm.covers(input, weight, sequence_parallel, fused_wgrad):
            group = layers.get_tensor_model_parallel_group_if_none(tp_group) if allreduce_dgrad else None
            return cpu_gemm.linear(input, weight, bias, allreduce_dgrad, group, trainable)
        return super()._forward_impl(  # type: ignore[misc]
            input=input,
            weight=weight,
            bias=bias,
            gradient_accumulation_fusion=gradient_accumulation_fusion,
            allreduce_dgrad=allreduce_dgrad,
            sequence_parallel=sequence_parallel,
            grad_output_buffer=grad_output_buffer,
            tp_group=tp_group,
            **kwargs,
        )


class OpenBlasColumnParallelLinear(_OpenBlasForward, layers.ColumnParallelLinear):
    """megatron's ColumnParallelLinear, multiplying fp32 CPU tensors through OpenBLAS."""


class OpenBlasRowParallelLinear(_OpenBlasForward, layers.RowParallelLinear):
    """megatron's RowParallelLinear, multiplying fp32 CPU tensors through OpenBLAS."""


def gemm_of(chunks: list[torch.nn.Module]) -> str:
    """What the megatron linear layers of these chunks multiply with: "openblas" where all do through
    OpenBLAS, else "torch"."""
    linear = (layers.ColumnParallelLinear, layers.RowParallelLinear)
    found = [m for chunk in chunks for m in chunk.modules() if isinstance(m, linear)]
    return "openblas" if found and all(isinstance(m, _OpenBlasForward) for m in found) else "torch"
