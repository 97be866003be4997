"""Device names as a config writes them: "cuda:N", "node:K/cuda:N", or "cpu:N" (a process slot on a CPU
machine; "node:K/cpu:N" on another node). A plain "cuda:N" is on node 0.

    parse_device("node:1/cuda:3")   # Device(kind="cuda", node=1, index=3)
    str(Device("cpu", 0, 2))        # "cpu:2"

The cluster is `trainer.nnodes` × `trainer.n_devices_per_node` devices of one kind; `cluster_devices`
lists them in (node, index) order, the order ranks take them in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

DeviceKind = Literal["cuda", "cpu"]
DEVICE_FORMS = "cuda:N, node:K/cuda:N or cpu:N (N, K ≥ 0)"
_PATTERN = re.compile(r"(?:node:(\d+)/)?(cuda|cpu):(\d+)")


@dataclass(frozen=True, order=True)
class Device:
    """One device of the cluster: the `index`-th GPU (or CPU process slot) of node `node`."""

    node: int
    index: int
    kind: DeviceKind = "cuda"

    def __str__(self) -> str:
        name = f"{self.kind}:{self.index}"
        return name if self.node == 0 else f"node:{self.node}/{name}"


def parse_device(text: str) -> Device:
    """The Device a name stands for; a ValueError naming it and the accepted forms when it is none."""
    match = _PATTERN.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"{text!r} is not a device; write {DEVICE_FORMS}")
    node, kind, index = match.groups()
    return Device(node=int(node or 0), index=int(index), kind="cuda" if kind == "cuda" else "cpu")


def cluster_devices(nnodes: int, per_node: int, kind: DeviceKind = "cuda") -> list[Device]:
    """Every device of an nnodes × per_node cluster, in (node, index) order."""
    return [Device(node, index, kind) for node in range(nnodes) for index in range(per_node)]


def show_devices(devices: Iterable[Device | str]) -> str:
    """A device list as YAML writes it: [cpu:0, cpu:1]."""
    return "[" + ", ".join(str(d) for d in devices) + "]"


def describe_cluster(nnodes: int, per_node: int, kind: DeviceKind) -> str:
    """The cluster's devices in a few words: "cpu:0..cpu:1", "node:0..node:1 × cuda:0..cuda:7"."""
    on_node = f"{kind}:0" if per_node == 1 else f"{kind}:0..{kind}:{per_node - 1}"
    return on_node if nnodes == 1 else f"node:0..node:{nnodes - 1} × {on_node}"
