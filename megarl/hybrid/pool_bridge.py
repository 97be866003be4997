"""PoolBridge: one process group spanning the training pool and a separate rollout pool.

Each pool keeps its own torch.distributed world (its default group, megatron's or vLLM's groups); the
bridge is a further group built from its own store, never registered as anyone's default, so joining it
changes nothing in either world. Bridge ranks: the training ranks 0..n_train-1, then the engine ranks
n_train..n_train+n_engine-1. Training rank 0 serves the store at (host, port) — a free port on its
node (`megarl.controller.worker_group.free_port_on_rank0`).

The store also carries small messages: the parameter table (training rank 0 → engines, once) and the
version the trainer is about to publish (`set_pending_version`), which the partial-rollout loop polls
between engine steps without blocking (`pending_version`).
"""

from __future__ import annotations

import datetime
import pickle
from typing import Any

import torch.distributed as dist

from megarl.distributed.platform import platform
from megarl.distributed.store import tcp_store
from megarl.errors import MegarlError

_PREFIX = "megarl-bridge"
_PENDING = "pending_version"


def bridge_backend() -> str:
    """The bridge's transport: gloo on CPU; on GPUs nccl would be (the one place to change it)."""
    return "gloo" if not platform().is_cuda else "nccl"


class PoolBridge:
    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 1800.0) -> None:
        self.rank, self.world_size = rank, world_size
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = tcp_store(host, port, world_size, rank == 0, timeout)
        self.prefixed = dist.PrefixStore(_PREFIX, self.store)
        backend = bridge_backend()
        if backend != "gloo":
            raise MegarlError(
                "rollout.placement=separate: the weight bridge between the pools is built over gloo only "
                "so far (CPU runs); on GPUs set rollout.placement=colocated"
            )
        self.group = dist.ProcessGroupGloo(self.prefixed, rank, world_size, timeout)

    # ---- point to point (bridge ranks) --------------------------------------------------------------

    def isend(self, tensor, dst: int, tag: int):
        return self.group.send([tensor], dst, tag)

    def irecv(self, tensor, src: int, tag: int):
        return self.group.recv([tensor], src, tag)

    def barrier(self) -> None:
        self.group.barrier().wait()

    # ---- small messages through the store -----------------------------------------------------------

    def publish(self, key: str, value: Any) -> None:
        self.prefixed.set(key, pickle.dumps(value))

    def read(self, key: str) -> Any:
        """The value published under `key`; waits for it (up to the store's timeout)."""
        return pickle.loads(self.prefixed.get(key))

    def set_pending_version(self, version: int) -> None:
        """Announce that weights of `version` are about to be sent (training rank 0)."""
        self.prefixed.set(_PENDING, str(int(version)))

    def pending_version(self) -> int | None:
        """The latest announced version, or None before any; never blocks."""
        if not self.prefixed.check([_PENDING]):
            return None
        return int(self.prefixed.get(_PENDING))

    def close(self) -> None:
        self.group = None
        self.prefixed = None
        self.store = None
