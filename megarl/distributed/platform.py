"""The compute platform, chosen once per process: CUDA with NCCL, or CPU with gloo and the CPU shims.

Every device-dependent choice lives here (megatron's backend-spec-provider idea), so the rest of
megarl asks `platform()` instead of `torch.cuda.is_available()`: the device, the process-group backend,
synchronisation, memory probes, host-memory pinning, Transformer Engine, gloo twin groups and the
pipeline p2p settings. `Platform("cuda")` can be built on a CPU machine to inspect those choices.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch


@dataclass(frozen=True)
class Platform:
    device_type: Literal["cpu", "cuda"]

    @staticmethod
    def detect() -> Platform:
        return Platform("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    # ---- device and process groups ---------------------------------------------------------------

    @property
    def backend(self) -> str:
        """The torch.distributed backend: nccl on GPUs, gloo on CPU."""
        return "nccl" if self.is_cuda else "gloo"

    @property
    def device(self) -> torch.device:
        """The compute device of this process (the GPU `bind` selected)."""
        if self.is_cuda:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def bind(self, local_rank: int) -> None:
        """Make the GPU of `local_rank` this process's device (on CPU there is nothing to choose)."""
        if self.is_cuda:
            torch.cuda.set_device(local_rank % torch.cuda.device_count())

    @property
    def needs_cpu_shims(self) -> bool:
        """Whether megatron needs `distributed/cpu_shims.py` to run here."""
        return not self.is_cuda

    @property
    def gloo_twin_groups(self) -> bool:
        """Whether megatron creates a gloo twin of each group for CPU-side collectives: only next to
        NCCL; on CPU the groups already are gloo, and each twin costs threads and sockets."""
        return self.is_cuda

    @property
    def pipeline_p2p(self) -> dict[str, Any]:
        """Megatron ModelParallelConfig settings for the pipeline schedules' p2p exchange."""
        if self.is_cuda:
            # megatron's batched p2p. Shapes stay fixed per schedule call on every platform: megarl pads
            # the micro-batches of one call to one length, so a per-message shape exchange would buy
            # nothing (and megatron-core 0.16.1 refuses variable lengths with its default MoE dispatcher).
            return dict(batch_p2p_comm=True, batch_p2p_sync=True, variable_seq_lengths=False)
        # gloo pairs messages in order: batched p2p silently mismatches peers under PP x VPP, and so does
        # the shape exchange variable lengths would need.
        return dict(batch_p2p_comm=False, batch_p2p_sync=False, variable_seq_lengths=False)

    # ---- memory ----------------------------------------------------------------------------------

    @property
    def pin_memory(self) -> bool:
        """Whether host buffers are pinned: on GPU, so copies in both directions are fast."""
        return self.is_cuda

    def synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on CPU, where work is synchronous)."""
        if self.is_cuda:
            torch.cuda.synchronize()

    def memory_in_use(self) -> int:
        """Compute-device memory in use: torch.cuda.memory_allocated on GPU, the process RSS on CPU."""
        if self.is_cuda:
            return torch.cuda.memory_allocated()
        import psutil

        return psutil.Process().memory_info().rss

    def release_cached_memory(self) -> None:
        """Hand freed memory back: the CUDA cache to the driver (so vLLM can take it), or on CPU glibc's
        free heap pages to the OS (glibc keeps them mapped, and RSS would not show what was freed)."""
        if self.is_cuda:
            torch.cuda.empty_cache()
        elif (libc := _libc()) is not None:
            libc.malloc_trim(0)

    def reuse_freed_host_memory(self) -> bool:
        """On CPU, have glibc keep freed tensor memory for the next allocation: tensors under 1 GiB come
        from the heap (not a fresh mmap each); freed chunks inside the heap stay mapped, and at its top
        up to 256 MiB (`release_cached_memory` still hands it all back on demand). By default every
        tensor over glibc's mmap threshold (at most 32 MiB) is a fresh mapping that the kernel
        zero-fills page by page, and the activations of a CPU update are: at 26M parameters × 64
        sequences × 160 tokens, ~1.1 M page faults per update and a fifth of its time (`megarl bench
        train`). Returns whether it applied (CPU with glibc); MEGARL_REUSE_FREED_HOST_MEMORY=0 turns it
        off (RSS then follows the live tensors more closely)."""
        if self.is_cuda or os.environ.get(REUSE_FREED_HOST_MEMORY_ENV) == "0":
            return False
        return set_malloc_options(mmap_threshold=1 << 30, trim_threshold=0, top_pad=256 << 20)

    # ---- kernels ---------------------------------------------------------------------------------

    @property
    def transformer_engine(self) -> bool:
        """Whether Transformer Engine layers can be built (checked once; importing TE takes seconds)."""
        return self.is_cuda and _transformer_engine_imports()


@functools.cache
def platform() -> Platform:
    """This process's platform, detected on first use."""
    return Platform.detect()


@functools.cache
def _transformer_engine_imports() -> bool:
    # Without CUDA, TE raises RuntimeError at import (not ImportError).
    try:
        import transformer_engine.pytorch  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        return False
    return True


REUSE_FREED_HOST_MEMORY_ENV = "MEGARL_REUSE_FREED_HOST_MEMORY"
_MALLOPT = {"trim_threshold": -1, "top_pad": -2, "mmap_threshold": -3}  # glibc's malloc.h M_* numbers


def set_malloc_options(**options: int) -> bool:
    """glibc's `mallopt` for each of mmap_threshold / trim_threshold / top_pad (bytes, C ints: < 2**31);
    False where there is no glibc or it refused one."""
    if (libc := _libc()) is None:
        return False
    return all(libc.mallopt(_MALLOPT[name], value) == 1 for name, value in options.items())


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 -- glibc only
    except (OSError, AttributeError):
        return None
    return libc
