"""Where each role of a run goes: the pools of devices a config asks for, checked before any process starts.

    plan = placement(cfg)            # cfg resolved (which roles run is decided); ConfigError when invalid
    plan.pool_of("critic")           # the Pool the critic's worker group is built on
    plan.ref_in_actor_processes      # the reference runs inside the actor's processes

Each enabled role gets a set of devices:
- `<role>.devices` when set (the Python API writes it through `megarl.controller.device_map.DeviceMap`);
- else the actor takes the first `actor.n_devices` devices of the cluster (all of them when unset); the
  reference, and a critic or reward model without `n_devices`, take the actor's;
- a critic or reward model with `n_devices` but no `devices` gets a pool of that many devices of its own,
  tied to no device in particular (how roles were placed before `devices` existed).

Roles on the same set of devices share one pool (colocated: the reference inside the actor's processes,
the others in processes of their own beside them); roles on disjoint sets get a pool each. Partial
overlap, devices the cluster lacks, pools that together need more devices than the cluster has (two pools
on one device), and, under torchrun, a role that is not on every device are errors naming the role's key.

On Ray a pool becomes a `ResourcePool` of `Pool.nodes` devices per node. A Ray placement group reserves a
number of GPUs (or CPU slots), neither a particular GPU index nor, without custom resources, a particular
node: the plan decides which roles share a pool and how many devices each pool takes on each node; Ray
picks the physical devices, and with GPUs never gives one device to two pools.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from megarl.config.devices import (
    Device,
    DeviceKind,
    cluster_devices,
    describe_cluster,
    parse_device,
    show_devices,
)
from megarl.config.errors import ConfigError
from megarl.config.schema import MegarlConfig

__all__ = ["Placement", "Pool", "check_placement", "enabled_roles", "placement"]


@dataclass(frozen=True)
class Pool:
    """Devices reserved once, and the roles placed on them (in start order)."""

    roles: tuple[str, ...]
    devices: tuple[Device, ...]  # (node, index) order; () for an n_devices pool tied to no device
    size: int
    nodes: tuple[int, ...]  # devices on each node the pool spans, in node order (ResourcePool's `nodes`)

    @property
    def name(self) -> str:
        return self.roles[0]


@dataclass(frozen=True)
class Placement:
    pools: tuple[Pool, ...]

    def pool_of(self, role: str) -> Pool:
        for pool in self.pools:
            if role in pool.roles:
                return pool
        raise KeyError(f"the {role} role is not placed: it is not enabled")

    @property
    def pools_roles(self) -> tuple[str, ...]:
        """Every placed role."""
        return tuple(role for pool in self.pools for role in pool.roles)

    @property
    def ref_in_actor_processes(self) -> bool:
        """The reference shares the actor's devices, so it lives in the actor's processes and layout."""
        return "ref" in self.pool_of("actor").roles


def enabled_roles(cfg: MegarlConfig) -> list[str]:
    """The roles a run of `cfg` (resolved) starts, in start order; "rollout" when the engines have a pool
    of their own (rollout.placement=separate)."""
    roles = ["actor"] + [role for role in ("ref", "critic", "reward") if getattr(cfg, role).enable]
    return roles + (["rollout"] if cfg.rollout.placement == "separate" else [])


def placement(cfg: MegarlConfig) -> Placement:
    """The pools of `cfg` (resolved); a ConfigError listing every placement problem."""
    problems: list[str] = []
    plan = check_placement(cfg, problems)
    if plan is None:
        raise ConfigError(problems or ["trainer.nnodes and trainer.n_devices_per_node must be ≥ 1"])
    return plan


def check_placement(cfg: MegarlConfig, problems: list[str]) -> Placement | None:
    """Append every placement problem of `cfg` (resolved); the plan when there is none. Sizes below 1
    (trainer.*, n_devices) are left to the other checks and give None."""
    t = cfg.trainer
    if t.nnodes < 1 or t.n_devices_per_node < 1:
        return None
    before = len(problems)
    roles = enabled_roles(cfg)
    listed = {role: _parse(cfg, role, problems) for role in roles if getattr(cfg, role).devices is not None}
    kind = _check_kinds(listed, problems)
    for role, devices in listed.items():
        if devices is not None:
            _check_in_cluster(cfg, role, devices, problems)
            _check_count(cfg, role, devices, problems)
    if len(problems) > before:
        return None
    if "rollout" in roles and not _check_rollout_pool(cfg, listed, problems):
        return None
    sets = _device_sets(cfg, roles, {r: d for r, d in listed.items() if d is not None}, kind)
    if sets is None:
        return None
    if t.launcher == "torchrun":
        _check_torchrun(cfg, sets, kind, problems)
        return None if len(problems) > before else _plan(cfg, roles, sets)
    _check_overlaps(cfg, roles, sets, kind, problems)
    engines = sets.get("rollout")
    if isinstance(engines, tuple) and set(engines) & set(sets["actor"]):  # type: ignore[arg-type]
        problems.append(
            f"rollout.placement=separate, but the engines' devices {show_devices(engines)} are the actor's "
            f"({_source(cfg, 'actor', sets['actor'])}); give the engines devices the actor does not use "
            "(actor.n_devices or actor.devices), or use rollout.placement=colocated"
        )
    _check_capacity(cfg, sets, problems)
    if len(problems) > before:
        return None
    plan = _plan(cfg, roles, sets)
    if cfg.ref.enable and cfg.ref.parallel not in (None, cfg.actor.parallel) and plan.ref_in_actor_processes:
        problems.append(
            "ref.parallel differs from actor.parallel, but the reference shares the actor's devices and so runs "
            "in the actor's processes with the actor's layout; set ref.parallel=null, or give the reference "
            "devices of its own (ref.devices)"
        )
        return None
    return plan


def _parse(cfg: MegarlConfig, role: str, problems: list[str]) -> tuple[Device, ...] | None:
    """`<role>.devices` parsed; None (and the problems appended) when a name is wrong or repeated."""
    names = getattr(cfg, role).devices
    key = f"{role}.devices={show_devices(names)}"
    if not names:
        problems.append(
            f"{key} lists no device; list at least one (e.g. [cpu:0]), or set {role}.devices=null"
        )
        return None
    devices, ok = [], True
    for name in names:
        try:
            devices.append(parse_device(name))
        except ValueError as e:
            problems.append(f"{key}: {e}")
            ok = False
    repeated = sorted({str(d) for d, n in Counter(devices).items() if n > 1})
    if repeated:
        problems.append(f"{key} lists {', '.join(repeated)} more than once; list each device once")
        ok = False
    kinds = sorted({d.kind for d in devices})
    if len(kinds) > 1:
        problems.append(
            f"{key} mixes {' and '.join(kinds)} devices; a role runs on one kind, e.g. "
            f"{show_devices(f'{kinds[0]}:{i}' for i in range(len(devices)))}"
        )
        ok = False
    return tuple(sorted(devices)) if ok else None


def _check_kinds(listed: dict[str, tuple[Device, ...] | None], problems: list[str]) -> DeviceKind:
    """One kind of device in the whole cluster: the first listed role's (cuda when none lists any)."""
    kinds = {role: devices[0].kind for role, devices in listed.items() if devices}
    if not kinds:
        return "cuda"
    first, kind = next(iter(kinds.items()))
    for role, other in kinds.items():
        if other != kind:
            problems.append(
                f"{role}.devices are {other} devices but {first}.devices are {kind}; the cluster has one kind: "
                f"write every role's devices as {kind}:N (or all as {other}:N)"
            )
    return kind


def _check_in_cluster(cfg: MegarlConfig, role: str, devices: tuple[Device, ...], problems: list[str]) -> None:
    t = cfg.trainer
    lacking = [d for d in devices if d.node >= t.nnodes or d.index >= t.n_devices_per_node]
    if not lacking:
        return
    fixes = []
    if any(d.index >= t.n_devices_per_node for d in lacking):
        fixes.append(f"trainer.n_devices_per_node to {max(d.index for d in lacking) + 1}")
    if any(d.node >= t.nnodes for d in lacking):
        fixes.append(f"trainer.nnodes to {max(d.node for d in lacking) + 1}")
    problems.append(
        f"{role}.devices={show_devices(devices)} names {', '.join(map(str, lacking))}, which the cluster lacks: "
        f"trainer.nnodes={t.nnodes} × trainer.n_devices_per_node={t.n_devices_per_node} gives "
        f"{describe_cluster(t.nnodes, t.n_devices_per_node, devices[0].kind)}; use devices from those or raise "
        + " and ".join(fixes)
    )


def _check_count(cfg: MegarlConfig, role: str, devices: tuple[Device, ...], problems: list[str]) -> None:
    """`<role>.n_devices`, when also set, must agree with the device list."""
    n_devices = getattr(getattr(cfg, role), "n_devices", None)
    if n_devices is not None and n_devices != len(devices):
        count = f"{len(devices)} device" + ("s" if len(devices) > 1 else "")
        problems.append(
            f"{role}.n_devices={n_devices} but {role}.devices={show_devices(devices)} lists {count}; set "
            f"{role}.n_devices=null (the devices decide) or list {n_devices} devices"
        )


def _device_sets(
    cfg: MegarlConfig, roles: list[str], listed: dict[str, tuple[Device, ...]], kind: DeviceKind
) -> dict[str, tuple[Device, ...] | int] | None:
    """Each role's devices, or the device count of an n_devices pool tied to no device; None when an
    n_devices is out of range (the worker-group checks report it)."""
    t, cluster = cfg.trainer, cfg.cluster_size()
    sets: dict[str, tuple[Device, ...] | int] = {}
    for role in roles:
        n_devices = getattr(getattr(cfg, role), "n_devices", None)
        if role in listed:
            sets[role] = listed[role]
        elif n_devices is not None and not 1 <= n_devices <= cluster:
            return None
        elif role == "actor":
            sets[role] = tuple(cluster_devices(t.nnodes, t.n_devices_per_node, kind)[: n_devices or cluster])
        elif role == "ref" or n_devices is None:
            sets[role] = sets["actor"]
        else:
            sets[role] = n_devices
    return sets


def _check_rollout_pool(
    cfg: MegarlConfig, listed: dict[str, tuple[Device, ...] | None], problems: list[str]
) -> bool:
    """rollout.placement=separate: the engines need devices the actor does not use (whole cluster by
    default), under Ray. False (problems appended) when not."""
    r, before = cfg.rollout, len(problems)
    if cfg.trainer.launcher != "ray":
        problems.append(
            "rollout.placement=separate needs trainer.launcher=ray: under torchrun every role runs in each "
            "process, so the engines cannot have devices of their own; set trainer.launcher=ray or "
            "rollout.placement=colocated"
        )
    if r.devices is None and r.n_devices is None:
        problems.append(
            "rollout.placement=separate needs the engines' devices: set rollout.n_devices (a pool of that many) "
            "or rollout.devices, and leave them out of the actor's (actor.n_devices or actor.devices)"
        )
    elif cfg.actor.devices is None and cfg.actor.n_devices is None:
        wanted = r.n_devices if r.devices is None else len(r.devices)
        spare = cfg.cluster_size() - (wanted or 0)
        fix = f"set actor.n_devices={spare}" if spare > 0 else "add devices (trainer.n_devices_per_node)"
        problems.append(
            f"rollout.placement=separate gives the engines {wanted} device(s) of their own, but the actor takes "
            f"the whole cluster ({cfg.cluster_size()} devices: actor.n_devices and actor.devices unset); {fix}"
        )
    elif r.devices is not None and cfg.actor.devices is not None and set(r.devices) & set(cfg.actor.devices):
        problems.append(
            f"rollout.placement=separate, but rollout.devices={r.devices} shares devices with actor.devices="
            f"{cfg.actor.devices}; give the engines devices the actor does not use, or use "
            "rollout.placement=colocated"
        )
    return len(problems) == before


def _source(cfg: MegarlConfig, role: str, devices: tuple[Device, ...]) -> str:
    """Where a role's devices come from, for problem lines."""
    section = getattr(cfg, role)
    if section.devices is not None:
        return f"{role}.devices={show_devices(devices)}"
    n_devices = getattr(section, "n_devices", None)
    if role == "actor":
        if n_devices is None:
            return f"{show_devices(devices)}, the whole cluster (actor.devices unset)"
        return f"{show_devices(devices)}, the first {n_devices} of the cluster (actor.n_devices={n_devices})"
    return f"{show_devices(devices)}, the actor's ({role}.devices unset)"


def _check_overlaps(
    cfg: MegarlConfig,
    roles: list[str],
    sets: dict[str, tuple[Device, ...] | int],
    kind: DeviceKind,
    problems: list[str],
) -> None:
    """Roles share all their devices or none."""
    t = cfg.trainer
    pinned = {role: devices for role, devices in sets.items() if isinstance(devices, tuple)}
    taken = {d for devices in pinned.values() for d in devices}
    free = [d for d in cluster_devices(t.nnodes, t.n_devices_per_node, kind) if d not in taken]
    seen: list[str] = []
    for role in (r for r in roles if r in pinned):
        mine = set(pinned[role])
        for other in seen:
            theirs = set(pinned[other])
            if mine != theirs and mine & theirs:
                spare = (
                    f"({', '.join(map(str, free))})" if free else "(none is free: give the other roles fewer)"
                )
                problems.append(
                    f"{role}.devices={show_devices(pinned[role])} shares {', '.join(map(str, sorted(mine & theirs)))} "
                    f"with the {other}'s devices ({_source(cfg, other, pinned[other])}) but not all of them; roles "
                    f"share all their devices (colocated) or none (a pool each): use "
                    f"{role}.devices={show_devices(pinned[other])}, or devices no other role uses {spare}"
                )
                break
        seen.append(role)


def _check_capacity(
    cfg: MegarlConfig, sets: dict[str, tuple[Device, ...] | int], problems: list[str]
) -> None:
    """Pools of n_devices tied to no device must fit beside the others: no two pools on one device."""
    t, cluster = cfg.trainer, cfg.cluster_size()
    used = len({d for devices in sets.values() if isinstance(devices, tuple) for d in devices})
    for role, n in sets.items():
        if isinstance(n, tuple):
            continue
        if used + n > cluster:
            free = cluster - used
            fixes = [] if role == "rollout" else [f"set {role}.n_devices=null to share the actor's devices"]
            fixes += [f"lower it to at most {free}"] if free else []
            problems.append(
                f"{role}.n_devices={n} gives the {role} a pool of its own, but the pools before it take {used} of the "
                f"cluster's {cluster} devices (trainer.nnodes·trainer.n_devices_per_node = {t.nnodes}·"
                f"{t.n_devices_per_node}): two pools would share a device (over-subscription); "
                f"{', '.join(fixes)}{', or ' if fixes else ''}add devices"
            )
        used += n


def _check_torchrun(
    cfg: MegarlConfig, sets: dict[str, tuple[Device, ...] | int], kind: DeviceKind, problems: list[str]
) -> None:
    """Under torchrun every role is a worker in each process: every role is on every device."""
    t = cfg.trainer
    everything = tuple(cluster_devices(t.nnodes, t.n_devices_per_node, kind))
    for role, devices in sets.items():
        if isinstance(devices, tuple) and getattr(cfg, role).devices is not None and devices != everything:
            problems.append(
                f"{role}.devices={show_devices(devices)} needs trainer.launcher=ray; under torchrun every role runs "
                f"in each of the {len(everything)} processes: set {role}.devices=null"
            )


def _plan(cfg: MegarlConfig, roles: list[str], sets: dict[str, tuple[Device, ...] | int]) -> Placement:
    per_node = cfg.trainer.n_devices_per_node
    pools: list[Pool] = []
    by_devices: dict[frozenset[Device], int] = {}
    for role in roles:
        devices = sets[role]
        if isinstance(devices, int):  # an n_devices pool: whole nodes first, as Ray packs them
            nodes = [per_node] * (devices // per_node) + ([devices % per_node] if devices % per_node else [])
            pools.append(Pool((role,), (), devices, tuple(nodes)))
            continue
        key = frozenset(devices)
        if key in by_devices:
            pool = pools[by_devices[key]]
            pools[by_devices[key]] = Pool((*pool.roles, role), pool.devices, pool.size, pool.nodes)
            continue
        counts = Counter(d.node for d in devices)
        by_devices[key] = len(pools)
        pools.append(Pool((role,), devices, len(devices), tuple(counts[n] for n in sorted(counts))))
    return Placement(tuple(pools))
