"""The named patches that let megatron-core 0.16.1 run on CPU over gloo.

Applied only where the platform needs them (`platform().needs_cpu_shims`; `apply_cpu_shims` is a
no-op otherwise). Each shim is listed in `SHIMS` with what it patches; `tests/multiproc/test_cpu_shims.py`
removes each one in turn and shows the megatron call that then fails, so a shim that stops being
needed is noticed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from megarl.distributed.platform import platform

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Shim:
    name: str
    needed_for: str
    apply: Callable[[], None]
    remove: Callable[[], None]


_originals: dict[str, object] = {}


def _swap(owner: object, attr: str, new: object, key: str) -> None:
    _originals.setdefault(key, getattr(owner, attr))
    setattr(owner, attr, new)


def _restore(owner: object, attr: str, key: str) -> None:
    if key in _originals:
        setattr(owner, attr, _originals.pop(key))


# --- current_device: megatron allocates buffers on torch.cuda.current_device() ---------------------


def _apply_current_device() -> None:
    _swap(torch.cuda, "current_device", lambda: _CPU, "current_device")


def _remove_current_device() -> None:
    _restore(torch.cuda, "current_device", "current_device")


# --- rng: megatron forks a CUDA generator for TP-local randomness, even with dropout 0 -------------


def _cpu_tracker_class():
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(_originals["rng"]):  # type: ignore[misc, valid-type]
        """Megatron's RNG-states tracker with the CPU generator standing in for the CUDA one."""

        def add(self, name, seed):
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self._is_initialized = True
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def _apply_rng() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    _originals.setdefault("rng", mrandom.CudaRNGStatesTracker)
    mrandom.CudaRNGStatesTracker = _cpu_tracker_class()
    mrandom.initialize_rng_tracker(force_reset=True)
    # Activation recomputation saves and restores "the CUDA generator" around each recomputed layer.
    _swap(mrandom, "_get_cuda_rng_state", lambda *args, **kwargs: torch.get_rng_state(), "rng_get")
    _swap(
        mrandom, "_set_cuda_rng_state", lambda state, *args, **kwargs: torch.set_rng_state(state), "rng_set"
    )


def _remove_rng() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    if "rng" in _originals:
        mrandom.CudaRNGStatesTracker = _originals.pop("rng")
        mrandom.initialize_rng_tracker(force_reset=True)
    _restore(mrandom, "_get_cuda_rng_state", "rng_get")
    _restore(mrandom, "_set_cuda_rng_state", "rng_set")


# --- cuda_literal: schedules, optimizer and default masks write device="cuda" literally ------------
# A mode sees every torch call: it costs ~15-25% of a tiny model's CPU forward+backward. Wrapping just
# the torch.* factories instead was cheaper but made transformers load wrong weights (seen: HF loss 7.33
# instead of 7.52 once the factories were wrapped before the first from_pretrained), so: a mode.


def _is_cuda(device: object) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaLiteralToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": _CPU}
        if func in (torch.Tensor.to, torch.Tensor.cuda) and args:
            args = tuple(_CPU if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


_literal_mode: _CudaLiteralToCpu | None = None


def _apply_cuda_literal() -> None:
    global _literal_mode
    if _literal_mode is None:
        _literal_mode = _CudaLiteralToCpu()
        _literal_mode.__enter__()
    _swap(torch.Tensor, "cuda", lambda self, *a, **k: self, "tensor_cuda")


@contextlib.contextmanager
def cuda_literal_suspended() -> Iterator[None]:
    """The cuda_literal mode off for a block that never runs Megatron code (the rollout engine): vLLM's
    CPU decode makes thousands of small torch calls per token and the mode's Python hook sat on each
    (megarl bench e2e, tiny model: see the closing note of the benchmarks issue). A no-op unless the
    mode is on and innermost (a mode pushed above it stays untouched)."""
    mode = _literal_mode
    depth = torch._C._len_torch_function_stack()
    if mode is None or depth == 0 or torch._C._get_function_stack_at(depth - 1) is not mode:
        yield
        return
    mode.__exit__(None, None, None)
    try:
        yield
    finally:
        mode.__enter__()


def _remove_cuda_literal() -> None:
    global _literal_mode
    if _literal_mode is not None:
        _literal_mode.__exit__(None, None, None)
        _literal_mode = None
    _restore(torch.Tensor, "cuda", "tensor_cuda")


# --- cuda_sync: dist-checkpoint save and p2p sync call torch.cuda.synchronize ----------------------


def _apply_cuda_sync() -> None:
    _swap(torch.cuda, "synchronize", lambda *a, **k: None, "cuda_sync")


def _remove_cuda_sync() -> None:
    _restore(torch.cuda, "synchronize", "cuda_sync")


# --- cuda_type_str: optimizer and grad clipping assert param.type() == 'torch.cuda.FloatTensor' ----


def _apply_cuda_type_str() -> None:
    original = _originals.setdefault("cuda_type_str", torch.Tensor.type)

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs and self.device.type == "cpu":
            name = original(self)  # may already be rewritten: the cuda_literal mode re-enters this
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_


def _remove_cuda_type_str() -> None:
    _restore(torch.Tensor, "type", "cuda_type_str")


# --- sp_norm: sequence parallel asserts the norm is TE's; torch norms are fine once tagged ---------


def _apply_sp_norm() -> None:
    from megatron.core.transformer import torch_norm

    original = _originals.setdefault("sp_norm", torch_norm.WrappedTorchNorm.__new__)

    def new(cls, config, hidden_size, eps=1e-5, **kwargs):
        sequence_parallel = config.sequence_parallel
        config.sequence_parallel = False
        try:
            norm = original(cls, config, hidden_size, eps, **kwargs)
        finally:
            config.sequence_parallel = sequence_parallel
        for param in norm.parameters():
            param.sequence_parallel = sequence_parallel
        return norm

    torch_norm.WrappedTorchNorm.__new__ = new


def _remove_sp_norm() -> None:
    from megatron.core.transformer import torch_norm

    _restore(torch_norm.WrappedTorchNorm, "__new__", "sp_norm")


# --- recompute_mask: activation recomputation rebuilds the causal mask inside backward --------------
# (megatron's own DotProductAttention only: the SDPA core attention of the CPU spec builds no mask, so
# this matters where that falls back, e.g. attention dropout in training.)
# The cuda_literal mode cannot help there: a TorchFunctionMode is switched off while it handles a call,
# and Tensor.backward is such a call, so the recomputed forward runs without it.


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, device=_CPU), diagonal=1).bool()


def _apply_recompute_mask() -> None:
    from megatron.core.fusions import fused_softmax

    _swap(fused_softmax, "get_default_causal_mask", _cpu_causal_mask, "recompute_mask")


def _remove_recompute_mask() -> None:
    from megatron.core.fusions import fused_softmax

    _restore(fused_softmax, "get_default_causal_mask", "recompute_mask")


# --- moe_dtoh_stream: the all-to-all MoE token dispatcher copies its split sizes to the host on a side
# CUDA stream (created in its constructor) and waits on an event from it; on CPU the sizes are host
# tensors already, so the same copies run without a stream.


def _cpu_dtoh_and_synchronize(self, point, tokens_per_expert=None):
    """MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize without streams: at the copy point the
    split sizes become numpy arrays (what the CUDA path's host copies give), nothing to wait for."""
    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        for name in ("input_splits", "output_splits", "output_splits_tp"):
            value = getattr(self, name)
            if torch.is_tensor(value):
                setattr(self, name, value.numpy())
    return tokens_per_expert


def _apply_moe_dtoh_stream() -> None:
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as d

    _swap(d, "cuda_dtoh_stream", "cpu", "moe_stream")  # set: the constructor then creates none
    _swap(d, "_maybe_dtoh_and_synchronize", _cpu_dtoh_and_synchronize, "moe_dtoh")


def _remove_moe_dtoh_stream() -> None:
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as d

    _restore(d, "cuda_dtoh_stream", "moe_stream")
    _restore(d, "_maybe_dtoh_and_synchronize", "moe_dtoh")


# --- moe_router_gemm: without Transformer Engine, megatron's router linear reads a name (te_general_gemm)
# that only TE's import defines (NameError); None selects its torch.mm branch.


def _apply_moe_router_gemm() -> None:
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        _originals["moe_router_gemm"] = True


def _remove_moe_router_gemm() -> None:
    from megatron.core.transformer.moe import moe_utils

    if _originals.pop("moe_router_gemm", None):
        del moe_utils.te_general_gemm


# --- uneven_split: with TP and EP the all-to-all dispatcher gathers and reduce-scatters tokens over TP
# in uneven per-rank splits (all_gather into unequal tensors, list reduce_scatter), which gloo refuses
# ("invalid tensor size"; no reduce_scatter). Equal-size collectives give the same tensors: the gather
# pads every split to the largest, the reduce-scatter all-reduces and keeps this rank's split.


def _gather_uneven(input_, group, output_split_sizes=None, use_global_buffer=False):
    import torch.distributed as dist

    if output_split_sizes is None or group.size() == 1:
        return _originals["uneven_gather"](input_, group, output_split_sizes, use_global_buffer)
    rows = max(output_split_sizes)
    padded = input_.new_zeros(rows, *input_.shape[1:])
    padded[: input_.shape[0]] = input_
    gathered = [torch.empty_like(padded) for _ in range(group.size())]
    dist.all_gather(gathered, padded.contiguous(), group=group)
    return torch.cat([g[:n] for g, n in zip(gathered, output_split_sizes)])


def _reduce_scatter_uneven(input_, group, input_split_sizes=None, use_global_buffer=False):
    import torch.distributed as dist

    if input_split_sizes is None or group.size() == 1:
        return _originals["uneven_scatter"](input_, group, input_split_sizes, use_global_buffer)
    total = input_.contiguous().clone()
    dist.all_reduce(total, group=group)
    return total.split(list(input_split_sizes))[group.rank()].contiguous()


def _apply_uneven_split() -> None:
    from megatron.core.tensor_parallel import mappings

    _swap(mappings, "_gather_along_first_dim", _gather_uneven, "uneven_gather")
    _swap(mappings, "_reduce_scatter_along_first_dim", _reduce_scatter_uneven, "uneven_scatter")


def _remove_uneven_split() -> None:
    from megatron.core.tensor_parallel import mappings

    _restore(mappings, "_gather_along_first_dim", "uneven_gather")
    _restore(mappings, "_reduce_scatter_along_first_dim", "uneven_scatter")


SHIMS: dict[str, Shim] = {
    s.name: s
    for s in (
        Shim(
            "current_device",
            "every forward; DDP buffers; checkpoint save",
            _apply_current_device,
            _remove_current_device,
        ),
        Shim(
            "rng",
            "any model (the TP-region RNG is forked even at dropout 0); activation recomputation",
            _apply_rng,
            _remove_rng,
        ),
        Shim(
            "cuda_literal",
            "pipeline schedules, optimizer, default causal mask",
            _apply_cuda_literal,
            _remove_cuda_literal,
        ),
        Shim("cuda_sync", "dist-checkpoint save", _apply_cuda_sync, _remove_cuda_sync),
        Shim(
            "cuda_type_str",
            "optimizer and grad clipping type asserts",
            _apply_cuda_type_str,
            _remove_cuda_type_str,
        ),
        Shim("sp_norm", "sequence parallelism with the torch norm", _apply_sp_norm, _remove_sp_norm),
        Shim(
            "recompute_mask",
            "activation recomputation (gradient checkpointing)",
            _apply_recompute_mask,
            _remove_recompute_mask,
        ),
        Shim(
            "moe_dtoh_stream",
            "MoE layers with the all-to-all token dispatcher",
            _apply_moe_dtoh_stream,
            _remove_moe_dtoh_stream,
        ),
        Shim(
            "moe_router_gemm",
            "MoE routers without Transformer Engine",
            _apply_moe_router_gemm,
            _remove_moe_router_gemm,
        ),
        Shim(
            "uneven_split",
            "MoE layers with TP and EP (the dispatcher's uneven TP gathers)",
            _apply_uneven_split,
            _remove_uneven_split,
        ),
    )
}

_applied: set[str] = set()
_deferred: set[str] = set()
# These patch megatron modules; importing megatron costs ~5 s per process, so a process that never
# builds a model (a Ray worker answering `coordinates`) should not pay for it.
_NEEDS_MEGATRON = ("rng", "sp_norm", "recompute_mask", "moe_dtoh_stream", "moe_router_gemm", "uneven_split")


def apply_cpu_shims(skip: tuple[str, ...] = ()) -> list[str]:
    """Apply every shim (minus `skip` and `$MEGARL_SKIP_CPU_SHIMS`) where the platform needs them.

    Shims that patch megatron wait until megatron is imported: `apply_megatron_shims` applies them.
    """
    if not platform().needs_cpu_shims:
        return []
    skip = (*skip, *filter(None, os.environ.get("MEGARL_SKIP_CPU_SHIMS", "").split(",")))
    unknown = set(skip) - SHIMS.keys()
    if unknown:
        raise ValueError(f"unknown CPU shim(s) {sorted(unknown)}; known: {sorted(SHIMS)}")
    megatron_loaded = "megatron.core" in sys.modules
    for name, shim in SHIMS.items():
        if name in skip or name in _applied:
            continue
        if name in _NEEDS_MEGATRON and not megatron_loaded:
            _deferred.add(name)
            continue
        shim.apply()
        _applied.add(name)
        _deferred.discard(name)
    return sorted(_applied)


def apply_megatron_shims() -> None:
    """Apply the deferred megatron shims (called once megatron is imported; a no-op with CUDA)."""
    for name in sorted(_deferred):
        SHIMS[name].apply()
        _applied.add(name)
    _deferred.clear()


def remove_cpu_shim(name: str) -> None:
    """Undo one shim (tests use this to show why it exists)."""
    _deferred.discard(name)
    if name in _applied:
        SHIMS[name].remove()
        _applied.discard(name)
