"""Peak memory of one side of an in-process benchmark (one model built, then updated), measured so that
several sides can run one after another in the same process.

GPU: `torch.cuda.memory_allocated` before the side is built is its baseline; once built, the peak
counter is reset (`reset_peak_memory_stats`), and the side's peak is `max_memory_allocated` over its
updates minus the baseline: weights, gradients, optimizer state and the updates' transients, not the
loader's one-off copies. Tensors only (not the caching allocator's reserve).

CPU: the growth of the process's resident set, kept by the kernel, not sampled. Before the side, a
garbage collection and glibc's `malloc_trim(0)` hand the previous side's freed pages back to the
kernel, and VmRSS is the baseline; once built, writing 5 to /proc/self/clear_refs (Linux >= 4.0) resets
the high-water mark VmHWM to the current RSS; after the updates the side's peak is VmHWM minus the
baseline. So no sampling thread competes with the timed calls and no short peak is missed. What RSS
cannot separate: pages the allocator keeps after a free still count (which is why each side trims
first, and why a bench measures its peaks in a launch of its own under `exact_host_memory`), and shared
libraries the side loads for the first time count to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
from collections.abc import Iterator
from pathlib import Path


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # "VmRSS:   123456 kB"
    raise KeyError(f"/proc/self/status has no {key} line")


def _trim_heap() -> None:
    """Return glibc's free pages to the kernel (a no-op where libc has no malloc_trim, e.g. musl)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def exact_host_memory() -> None:
    """From here on glibc serves every allocation over 128 KiB by its own mmap, unmapped when freed, so
    the RSS follows the live tensors. Otherwise freed buffers stay in the heap (by glibc's growing
    threshold), where RSS counts them long after: a peak would count the heap's fragments. It slows
    every allocation, hence a run of its own, launched under `exact_host_memory_launch`."""
    from megarl.distributed.platform import set_malloc_options

    set_malloc_options(mmap_threshold=128 << 10)


@contextlib.contextmanager
def exact_host_memory_launch() -> Iterator[None]:
    """The ranks launched inside start without `Platform.reuse_freed_host_memory` (its heap settings
    would override `exact_host_memory`'s)."""
    from megarl.distributed.platform import REUSE_FREED_HOST_MEMORY_ENV

    saved = os.environ.get(REUSE_FREED_HOST_MEMORY_ENV)
    os.environ[REUSE_FREED_HOST_MEMORY_ENV] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(REUSE_FREED_HOST_MEMORY_ENV, None)
        else:
            os.environ[REUSE_FREED_HOST_MEMORY_ENV] = saved


class PeakMemory:
    """start() before building the side, built() once its model and optimizer exist, stop() after its
    updates; then `result` = {"method", "built_bytes", "peak_bytes"} (growth over the baseline)."""

    def __init__(self) -> None:
        from megarl.distributed.platform import platform

        self.cuda = platform().is_cuda
        self.method = "cuda max_memory_allocated" if self.cuda else "VmHWM after clear_refs"
        self.base = self.built_bytes = self.peak_bytes = 0

    def _now(self) -> int:
        import torch

        return torch.cuda.memory_allocated() if self.cuda else _status_bytes("VmRSS")

    def start(self) -> None:
        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        else:
            _trim_heap()
        self.base = self._now()

    def built(self) -> None:
        self.built_bytes = self._now() - self.base
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError as e:  # an old kernel or a locked-down /proc: no honest CPU peak then
                self.method = f"none (/proc/self/clear_refs: {e.strerror})"

    def stop(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self.base
        elif self.method.startswith("VmHWM"):
            self.peak_bytes = _status_bytes("VmHWM") - self.base

    @property
    def result(self) -> dict:
        measured = not self.method.startswith("none")
        return {
            "method": self.method,
            "built_bytes": self.built_bytes,
            "peak_bytes": self.peak_bytes if measured else None,
        }
