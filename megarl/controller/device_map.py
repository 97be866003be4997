"""DeviceMap: where one role runs and how it is split over those devices, as a Python value.

    from megarl.controller.device_map import DeviceMap

    DeviceMap(strategy="megatron", devices=["cuda:0", "cuda:1", "cuda:2", "cuda:3"], tp=2)   # TP2 × DP2
    DeviceMap(strategy="single", devices=["cuda:4"])        # one device, no parallelism
    DeviceMap(strategy="dp", devices=["cpu:0", "cpu:1"])    # data parallel over CPU process slots
    DeviceMap("megatron", ["node:1/cuda:0", "node:1/cuda:1"], pp=2)

    cfg = DeviceMap("dp", ["cpu:1"]).apply(cfg, "critic")   # writes critic.devices and critic.parallel
    validate(cfg)                                           # the pools: megarl.config.placement

A map is checked on its own when it is built (device names, strategy, the layout dividing the devices) and
raises `ConfigError`; `apply(cfg, role)` writes it into the config (`<role>.devices`, `<role>.parallel`,
`<role>.n_devices=None`) for "actor", "critic", "ref" or "reward", so the Python API and a YAML file
(`critic.devices: [cpu:1]`) are one path: the config's validation then checks the maps of all roles
together (devices the cluster lacks, partial overlaps, two pools on one device, the layout against the
model) before any process starts. Roles given the same devices are colocated in one pool; disjoint
devices get a pool each; the reference on the actor's devices lives in the actor's processes.

Devices are "cuda:N", "node:K/cuda:N" or "cpu:N" (process slots on a CPU machine). Under Ray the map
decides which roles share a pool and how many devices each pool takes per node: a Ray placement group
cannot be pinned to a GPU index (nor, without custom resources, to a node), so Ray picks the physical
devices of each pool (never one GPU for two pools).

Strategies: "megatron" (tp, pp, cp, ep, vpp, sequence_parallel; dp = devices / (tp·pp·cp)), "single"
(exactly one device), "dp" (plain data parallelism over every device), "fsdp" (the role on the fsdp
backend: the transformers model sharded with FSDP2 over every device; `apply` sets `<role>.backend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from megarl.config.devices import parse_device, show_devices
from megarl.config.errors import ConfigError
from megarl.config.schema import MegarlConfig, ParallelConfig
from megarl.distributed.layout import LayoutKeys, ParallelLayout

Strategy = Literal["megatron", "single", "dp", "fsdp"]
STRATEGIES = ("megatron", "single", "dp", "fsdp")
ROLES = ("actor", "critic", "ref", "reward")
_SIZES = ("tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class DeviceMap:
    """One role's devices and parallel layout; raises ConfigError listing every problem of the map."""

    strategy: Strategy = "megatron"
    devices: Sequence[str] = ()  # "cuda:N" | "node:K/cuda:N" | "cpu:N"; kept as a tuple
    tp: int = 1  # tensor-parallel size (megatron)
    pp: int = 1  # pipeline-parallel size (megatron)
    cp: int = 1  # context-parallel size (megatron)
    ep: int = 1  # expert-parallel size (megatron, MoE models)
    vpp: int | None = None  # virtual pipeline stages per PP rank (megatron); None = off
    sequence_parallel: bool = False  # megatron; needs tp > 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(str(d) for d in self.devices))
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    def problems(self) -> list[str]:
        """Every problem of the map on its own (the cluster and the other roles are the config's checks)."""
        name = f"DeviceMap(strategy={self.strategy!r}, devices={show_devices(self.devices)})"
        if self.strategy not in STRATEGIES:
            return [f"{name}: unknown strategy; use one of {', '.join(map(repr, STRATEGIES))}"]
        if not self.devices:
            return [f"{name} lists no device; give at least one, e.g. devices=['cuda:0']"]
        problems = []
        for device in self.devices:
            try:
                parse_device(device)
            except ValueError as e:
                problems.append(f"{name}: {e}")
        if self.strategy == "single" and len(self.devices) != 1:
            problems.append(
                f"{name}: strategy='single' runs on exactly one device, not {len(self.devices)}; list one, or "
                "use strategy='dp' (or 'megatron') for several"
            )
        parallel = [f"{n}={getattr(self, n)}" for n in _SIZES if getattr(self, n) != 1]
        parallel += [f"vpp={self.vpp}"] * (self.vpp is not None)
        parallel += ["sequence_parallel=True"] * self.sequence_parallel
        if self.strategy in ("single", "dp", "fsdp") and parallel:
            problems.append(
                f"{name}: strategy={self.strategy!r} has no model parallelism, but {', '.join(parallel)} is set; "
                "use strategy='megatron' for it, or drop it"
            )
        elif self.strategy == "megatron" and not problems:
            where = f"the {len(self.devices)} devices"
            problems += [
                f"{name}: {p}" for p in ParallelLayout.check(self, len(self.devices), LayoutKeys(), where)
            ]
        return problems

    @property
    def world_size(self) -> int:
        """Processes of the role's worker group: one per device."""
        return len(self.devices)

    @property
    def parallel(self) -> ParallelConfig:
        """The config's layout section for this map (all ones for "single" and "dp")."""
        return ParallelConfig(
            tp=self.tp,
            pp=self.pp,
            vpp=self.vpp,
            cp=self.cp,
            ep=self.ep,
            sequence_parallel=self.sequence_parallel,
        )

    def apply(self, cfg: MegarlConfig, role: str) -> MegarlConfig:
        """Write this map into `cfg` for `role` ("actor", "critic", "ref" or "reward"): `<role>.devices`,
        `<role>.parallel` and (where the role has it) `<role>.n_devices=None`. Changes `cfg` in place and
        returns it; `validate(cfg)` then checks all roles' maps together."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; a DeviceMap places one of {', '.join(ROLES)}")
        section = getattr(cfg, role)
        section.devices = list(self.devices)
        section.parallel = self.parallel
        if self.strategy == "fsdp" and role != "reward":
            section.backend = "fsdp"
        if hasattr(section, "n_devices"):
            section.n_devices = None
        return cfg
