"""Megatron's linear layers on CPU through OpenBLAS where torch's MKL is the slower fp32 GEMM.

torch's x86 wheels multiply with MKL, which runs AMD CPUs on a generic path: on an AMD EPYC (Zen 2,
AVX2) the 25M model's update GEMMs (9408 × 512 · 512 × 1536 and their backward shapes, 1 thread) run at
66–73 GF/s there and at 84–94 GF/s in the OpenBLAS that numpy ships (Zen kernels) — ~1.26× less GEMM
time, and GEMMs are ~78% of that update. On Intel CPUs MKL is the fast one (138–158 GF/s per core on an
AVX-512 Xeon), so `auto` keeps torch there. Decode-sized GEMMs (64 rows) gain nothing, so the rollout
engine keeps its own.

`linear` is megatron's linear-layer function for the case it covers (`covers`): fp32 CPU tensors, no
sequence parallelism, no deferred or fused weight gradients; `models/openblas_linear.py`'s Column/
RowParallelLinear call it there and megatron's own function otherwise. The CPU spec provider
(`models/backends.py`) builds the model with those layers, the output layer included, where
`openblas_chosen()`: `$MEGARL_CPU_GEMM` picks `auto` (default: OpenBLAS on AMD CPUs), `openblas`, or
`torch`.

OpenBLAS's sums differ in the last bit with its thread count and the operands' shapes (MKL's here do not
with the thread count): runs with OpenBLAS GEMMs repeat bit for bit at the same threads per rank and the
same micro-batches, not across them. torchrun gives each rank 1 thread only when --nproc_per_node > 1.
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np
import torch

from megarl.distributed.cpuinfo import cpuinfo_field
from megarl.distributed.platform import platform

_CHOICES = ("auto", "openblas", "torch")


@functools.cache
def _openblas():
    """numpy's OpenBLAS (threadpoolctl's handle on it), or None where numpy links another BLAS."""
    from threadpoolctl import ThreadpoolController

    libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
    return libs[0] if libs else None


def _cpu_vendor() -> str:
    return cpuinfo_field("vendor_id")


def openblas_chosen() -> bool:
    """Whether megatron's CPU linear layers multiply through OpenBLAS in this process."""
    choice = os.environ.get("MEGARL_CPU_GEMM", "auto")
    if choice not in _CHOICES:
        raise ValueError(f"MEGARL_CPU_GEMM={choice!r}: expected one of {', '.join(_CHOICES)}")
    if choice == "torch" or platform().is_cuda:
        return False
    if _openblas() is None:
        if choice == "openblas":
            raise RuntimeError(
                "MEGARL_CPU_GEMM=openblas, but numpy here is not linked to OpenBLAS (numpy's PyPI wheels "
                "are); install one of those or set MEGARL_CPU_GEMM=torch"
            )
        return False
    return choice == "openblas" or _cpu_vendor() == "AuthenticAMD"


_threads = [0]


def _blas_readable(t: torch.Tensor) -> torch.Tensor:
    """t if BLAS reads it as it is (row-major or transposed), else a row-major copy."""
    return t if t.is_contiguous() or t.t().is_contiguous() else t.contiguous()


def _as_blas(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a BLAS-readable 2-D fp32 tensor (`_blas_readable`); the tensor must outlive it.

    The view is built over the raw memory: torch's `Tensor.numpy()` marks the storage as never resizable
    again, which would break offloading (it frees parameters and gradients with `storage.resize_(0)`).
    """
    flat = np.frombuffer((ctypes.c_float * t.numel()).from_address(t.data_ptr()), dtype=np.float32)
    return flat.reshape(t.shape) if t.is_contiguous() else flat.reshape(t.shape[1], t.shape[0]).T


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D fp32 CPU tensors, by OpenBLAS with torch's intra-op thread count."""
    if not (a.numel() and b.numel()):
        return a @ b
    threads = torch.get_num_threads()
    if threads != _threads[0]:
        _openblas().set_num_threads(threads)
        _threads[0] = threads
    a, b = _blas_readable(a), _blas_readable(b)  # copies held here until the product is written
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)
    np.matmul(_as_blas(a), _as_blas(b), out=_as_blas(out))
    return out


class _Linear(torch.autograd.Function):
    """y = x · Wᵀ + b over a tensor-parallel shard: dgrad all-reduced over TP when asked, overlapped with
    the weight gradient (skipped for frozen weights)."""

    @staticmethod
    def forward(ctx, x, weight, bias, allreduce_dgrad, tp_group, weight_grad):
        ctx.save_for_backward(x, weight)
        ctx.allreduce_dgrad, ctx.tp_group, ctx.weight_grad = allreduce_dgrad, tp_group, weight_grad
        ctx.bias = bias is not None
        out = mm(x.reshape(-1, x.shape[-1]), weight.t())
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        grad_x = mm(grad, weight).view(x.shape)
        pending = None
        if ctx.allreduce_dgrad:
            pending = torch.distributed.all_reduce(grad_x, group=ctx.tp_group, async_op=True)
        grad_w = mm(grad.t(), x.reshape(-1, x.shape[-1])) if ctx.weight_grad else None
        grad_b = grad.sum(0) if ctx.bias else None
        if pending is not None:
            pending.wait()
        return grad_x, grad_w, grad_b, None, None, None


def covers(x: torch.Tensor, weight: torch.Tensor, sequence_parallel: bool, fused_wgrad: bool) -> bool:
    """Whether `linear` computes this call of megatron's linear function as megatron would."""
    return (
        not sequence_parallel
        and not (fused_wgrad and hasattr(weight, "main_grad"))
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
    )


def linear(x, weight, bias, allreduce_dgrad: bool, tp_group, weight_grad: bool) -> torch.Tensor:
    """x · Wᵀ + b by OpenBLAS, with megatron's TP dgrad all-reduce; no weight gradient for a frozen W."""
    return _Linear.apply(x, weight, bias, allreduce_dgrad, tp_group, weight_grad)
