"""Move a role's training state off the compute device and back: parameters, gradients, optimizer state.

The hybrid engine offloads before generation (the rollout engine needs the memory) and idle roles
offload between uses. Everything works on tensor *storages*: each storage's bytes are copied to a
target, then the storage is resized to zero bytes. Every view of it — param.data, DDP's contiguous
param/grad buffers, param.main_grad, bucket shards, the distributed optimizer's main-param shards —
stays the same Python object, and becomes valid again when reload resizes the storage and copies the
bytes back, so a round trip is bit-exact and training continues as if nothing happened.

Megatron's `_ParamAndGradBuffer.offload_to_cpu` uses the same mechanism; it is not called here
because it drops gradient values (reload re-zeroes them), moves parameters only when the distributed
optimizer put them into its buffer, and always stages through pinned host memory (no disk target).

Targets:
  HostMemory()          host memory, pinned when the compute device is a GPU. On CPU the compute device
                        *is* host memory: the bytes move but nothing is freed overall.
  DiskFiles(directory)  one file per offload (NVMe-offload style): the bytes leave process memory,
                        which on CPU is the only way the freed bytes show up as a smaller RSS.

Do not run forward/backward or step the optimizer on offloaded state: the views are empty.
"""

from __future__ import annotations

import itertools
import os
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from megarl.distributed.platform import platform

if TYPE_CHECKING:
    from megarl.models.optimizer import TrainOptimizer

# Copies between the state and a file go through a bounded host buffer.
_STAGING_BYTES = 32 << 20


@dataclass(frozen=True)
class OffloadReport:
    """What one offload or reload did."""

    state: str  # "params" | "grads" | "optimizer"
    direction: str  # "offload" | "reload"
    target: str  # "host", "disk:<directory>", or "dropped" (values not kept; reload zero-fills)
    bytes: int  # storage bytes released from (offload) or restored to (reload) the compute device
    storages: int  # distinct storages (a DDP buffer is one)
    device_bytes_before: int  # compute-device memory in use: Platform.memory_in_use
    device_bytes_after: int
    seconds: float

    @property
    def device_bytes_freed(self) -> int:
        """Measured drop of device memory (negative after a reload)."""
        return self.device_bytes_before - self.device_bytes_after


class _Stored(Protocol):
    def load_into(self, views: list[torch.Tensor]) -> None: ...


class OffloadTarget(Protocol):
    name: str

    def store(self, views: list[torch.Tensor], label: str) -> _Stored: ...


class HostMemory:
    """Host memory; pinned when the compute device is a GPU, so copies in both directions are fast."""

    name = "host"

    def store(self, views: list[torch.Tensor], label: str) -> _Stored:
        pin = platform().pin_memory
        copies = [torch.empty(v.numel(), dtype=torch.uint8, pin_memory=pin) for v in views]
        for copy, view in zip(copies, views):
            copy.copy_(view, non_blocking=pin)
        return _HostCopies(copies)


@dataclass
class _HostCopies:
    copies: list[torch.Tensor]

    def load_into(self, views: list[torch.Tensor]) -> None:
        for view, copy in zip(views, self.copies):
            view.copy_(copy, non_blocking=copy.is_pinned())
        platform().synchronize()
        self.copies.clear()


@dataclass(frozen=True)
class DiskFiles:
    """Files under `directory` (local NVMe ideally), one per offload, deleted again on reload."""

    directory: str | Path

    @property
    def name(self) -> str:
        return f"disk:{self.directory}"

    def store(self, views: list[torch.Tensor], label: str) -> _Stored:
        path = Path(self.directory) / f"{label}-pid{os.getpid()}-{next(_file_ids)}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = _staging(views)
        with open(path, "wb") as f:
            for view in views:
                for start in range(0, view.numel(), staging.numel()):
                    part = staging[: min(staging.numel(), view.numel() - start)]
                    part.copy_(view[start : start + part.numel()])
                    f.write(memoryview(part.numpy()))
        return _FileCopy(path)


_file_ids = itertools.count()


@dataclass
class _FileCopy:
    path: Path

    def load_into(self, views: list[torch.Tensor]) -> None:
        staging = _staging(views)
        with open(self.path, "rb") as f:
            for view in views:
                for start in range(0, view.numel(), staging.numel()):
                    part = staging[: min(staging.numel(), view.numel() - start)]
                    if f.readinto(memoryview(part.numpy())) != part.numel():
                        raise RuntimeError(f"{self.path} is shorter than the state it should restore")
                    view[start : start + part.numel()].copy_(part)
        self.path.unlink()


class _Dropped:
    """Values not kept (gradients that were already consumed): reload hands back zeros."""

    def load_into(self, views: list[torch.Tensor]) -> None:
        for view in views:
            view.zero_()


def _staging(views: list[torch.Tensor]) -> torch.Tensor:
    """A bounded host buffer between the state and a file. Never hand a state tensor to numpy: that
    marks its storage non-resizable for good, and the next offload could not free it."""
    size = max(1, min(_STAGING_BYTES, max((v.numel() for v in views), default=1)))
    return torch.empty(size, dtype=torch.uint8, pin_memory=platform().pin_memory)


# --- storages --------------------------------------------------------------------------------------


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
        storage, 0, (storage.nbytes(),), (1,)
    )


def _unique_storages(tensors, exclude: set[tuple] = frozenset()) -> list[torch.UntypedStorage]:
    """Distinct non-empty storages behind `tensors` that live on the compute device."""
    here = platform().device
    seen, storages = set(exclude), []
    for tensor in tensors:
        if tensor is None or tensor.device != here:
            continue
        storage = tensor.untyped_storage()
        key = _storage_key(storage)
        if storage.nbytes() and key not in seen:
            seen.add(key)
            storages.append(storage)
    return storages


def _storage_key(storage: torch.UntypedStorage) -> tuple:
    return (str(storage.device), storage.data_ptr())


@dataclass
class _Offloaded:
    storages: list[torch.UntypedStorage]
    sizes: list[int]
    stored: _Stored
    target: str


# (owner, state) -> what is offloaded; owner = first model chunk or the TrainOptimizer.
_offloaded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _offload(owner, state: str, storages, target: OffloadTarget | None, keep_values: bool = True):
    per_owner = _offloaded.setdefault(owner, {})
    if state in per_owner:
        raise RuntimeError(f"{state} are already offloaded; reload them before offloading again")
    target = target or HostMemory()
    platform().release_cached_memory()  # so that `before` holds no garbage of earlier work
    before, start = platform().memory_in_use(), time.perf_counter()
    sizes = [s.nbytes() for s in storages]
    views = [_byte_view(s) for s in storages]
    stored = target.store(views, state) if keep_values else _Dropped()
    platform().synchronize()
    del views
    for storage in storages:
        storage.resize_(0)
    platform().release_cached_memory()
    name = target.name if keep_values else "dropped"
    per_owner[state] = _Offloaded(storages, sizes, stored, name)
    return OffloadReport(
        state,
        "offload",
        name,
        sum(sizes),
        len(storages),
        before,
        platform().memory_in_use(),
        time.perf_counter() - start,
    )


def _reload(owner, state: str) -> OffloadReport:
    entry = _offloaded.get(owner, {}).pop(state, None)
    if entry is None:
        raise RuntimeError(f"{state} are not offloaded; nothing to reload")
    before, start = platform().memory_in_use(), time.perf_counter()
    for storage, size in zip(entry.storages, entry.sizes):
        storage.resize_(size)
    entry.stored.load_into([_byte_view(s) for s in entry.storages])
    platform().synchronize()
    platform().release_cached_memory()  # the host copies or staging buffer
    return OffloadReport(
        state,
        "reload",
        entry.target,
        sum(entry.sizes),
        len(entry.storages),
        before,
        platform().memory_in_use(),
        time.perf_counter() - start,
    )


# --- the state of a role ---------------------------------------------------------------------------


def _local(tensor):
    """This rank's tensor: an FSDP2 parameter, gradient or Adam moment is a DTensor over its shard."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _params(chunks: list[torch.nn.Module]):
    return (_local(p) for chunk in chunks for p in chunk.parameters())


def _grads(chunks: list[torch.nn.Module]):
    # DDP accumulates into param.main_grad (views of its grad buffer); plain modules into param.grad.
    params = (p for chunk in chunks for p in chunk.parameters())
    return (_local(p.main_grad if hasattr(p, "main_grad") else p.grad) for p in params)


def offload_params(chunks: list[torch.nn.Module], target: OffloadTarget | None = None) -> OffloadReport:
    """Release the parameters' device memory (DDP-wrapped chunks or plain modules, e.g. the reference)."""
    return _offload(chunks[0], "params", _unique_storages(_params(chunks)), target)


def reload_params(chunks: list[torch.nn.Module]) -> OffloadReport:
    """Put the parameters back, bit-exact, in the same tensors."""
    return _reload(chunks[0], "params")


def offload_grads(
    chunks: list[torch.nn.Module], target: OffloadTarget | None = None, keep_values: bool = True
) -> OffloadReport:
    """Release the gradient buffers' device memory. With keep_values=False nothing is copied (the
    gradients were already used by a step) and reload_grads hands back zeros, as megatron's does."""
    return _offload(chunks[0], "grads", _unique_storages(_grads(chunks)), target, keep_values)


def reload_grads(chunks: list[torch.nn.Module]) -> OffloadReport:
    """Put the gradient buffers back (their values, or zeros if they were offloaded without them)."""
    return _reload(chunks[0], "grads")


def _optimizer_tensors(optimizer):
    """Main parameters and state of every torch optimizer inside a megatron (chained) optimizer, or of
    a torch optimizer itself (an FSDP role's)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        inners = [optimizer]
    else:
        inners = [m.optimizer for m in getattr(optimizer, "chained_optimizers", [optimizer])]
    for inner in inners:
        if inner is None:
            continue
        for group in inner.param_groups:
            yield from (_local(p) for p in group["params"])
        for state in inner.state.values():
            yield from (_local(v) for v in state.values() if isinstance(v, torch.Tensor))


def _optimizer_storages(opt: TrainOptimizer) -> list[torch.UntypedStorage]:
    """The optimizer's own storages: Adam moments and the fp32 main parameters it keeps apart from the
    model (storages shared with the model's parameters or gradients are the model's)."""
    model = {
        _storage_key(s) for s in _unique_storages(itertools.chain(_params(opt.chunks), _grads(opt.chunks)))
    }
    return _unique_storages(_optimizer_tensors(opt.optimizer), exclude=model)


def training_state_bytes(opt: TrainOptimizer) -> dict[str, int]:
    """This rank's device bytes of a trained role's state beside its weights: {"grads": the gradient
    buffers, "optimizer": the optimizer's own state} — what offload_grads / offload_optimizer move."""
    return {
        "grads": sum(s.nbytes() for s in _unique_storages(_grads(opt.chunks))),
        "optimizer": sum(s.nbytes() for s in _optimizer_storages(opt)),
    }


def offload_optimizer(opt: TrainOptimizer, target: OffloadTarget | None = None) -> OffloadReport:
    """Release the optimizer's device memory (`opt`: a TrainOptimizer): Adam moments and the fp32 main
    parameters it keeps apart from the model. Storages shared with the model's parameters or
    gradients (fp32 main params *are* the model's) are left to offload_params / offload_grads."""
    return _offload(opt, "optimizer", _optimizer_storages(opt), target)


def reload_optimizer(opt: TrainOptimizer) -> OffloadReport:
    """Put the optimizer state back, bit-exact."""
    return _reload(opt, "optimizer")


# --- a role's whole training state ----------------------------------------------------------------

# Offload order: the optimizer first, while the model storages it must leave alone are still there.
_STATES = ("optimizer", "grads", "params")


def offloaded_states(chunks: list[torch.nn.Module], optimizer: TrainOptimizer | None = None) -> list[str]:
    """Which of "params", "grads", "optimizer" of this model are offloaded now (read from the one
    record that offload and reload keep)."""
    owners = {"params": chunks[0], "grads": chunks[0], "optimizer": optimizer}
    return [s for s in reversed(_STATES) if owners[s] is not None and s in _offloaded.get(owners[s], {})]


def offload_state(
    chunks: list[torch.nn.Module],
    optimizer: TrainOptimizer | None,
    states: set[str],
    target: OffloadTarget | None = None,
) -> list[OffloadReport]:
    """Offload `states` (a subset of params / grads / optimizer) of a role's model, skipping what is
    already offloaded; a frozen model (`optimizer` None) has only params."""
    if optimizer is None and states - {"params"}:
        raise ValueError("a frozen model has no gradients or optimizer state to offload")
    done = offloaded_states(chunks, optimizer)
    actions = {
        "optimizer": lambda: offload_optimizer(optimizer, target),
        "grads": lambda: offload_grads(chunks, target),
        "params": lambda: offload_params(chunks, target),
    }
    return [actions[s]() for s in _STATES if s in states and s not in done]


def reload_state(
    chunks: list[torch.nn.Module], optimizer: TrainOptimizer | None = None
) -> list[OffloadReport]:
    """Bring back everything of this model that is offloaded, bit-exact."""
    actions = {
        "params": lambda: reload_params(chunks),
        "grads": lambda: reload_grads(chunks),
        "optimizer": lambda: reload_optimizer(optimizer),
    }
    return [actions[s]() for s in offloaded_states(chunks, optimizer)]
