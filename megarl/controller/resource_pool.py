"""Ray placement groups that reserve a worker group's devices, and the helper that starts or joins Ray.

A `ResourcePool` holds one STRICT_PACK placement group per node and one bundle per device; rank r of
every worker group built on the pool lands in `pool.placements()[r]`. Several groups may share a pool
(roles placed side by side on the same devices): each of their actors takes a `1 / max_colocate`
share of its bundle.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from megarl.config.machine import CPUS_PER_RANK
from megarl.errors import EXIT_USAGE, MegarlError


class ResourcePoolError(MegarlError, RuntimeError):
    """The cluster cannot host the requested pool, or the pool is already full or removed."""

    exit_code = EXIT_USAGE


def start_local_ray(num_cpus: int | None = None) -> None:
    """Join the Ray cluster the user names in `RAY_ADDRESS`, else start a private one for this process
    (no-op if Ray is up).

    - `RAY_ADDRESS` (host:port, or a `ray://` client address) is the only way to share a cluster: a
      cluster merely running on the machine (another run's, or the last `ray start --head`) is never
      joined, so two runs at once cannot end each other. The named address is probed first (a few
      seconds): one that does not answer is an error. Ray 2.60 has token auth on by default; a driver
      joining from another node needs `RAY_AUTH_MODE=token` and the cluster's token (`RAY_AUTH_TOKEN`).
    - Otherwise a one-node cluster starts, owned by this process (it ends with it), bound to loopback
      only (every Ray port answers on 127.0.0.1 alone), without the dashboard and without Ray's metrics
      exporter. `num_cpus` (default: max(8, the machine's cores)) is bookkeeping only: raise it so that,
      e.g., 4 ranks of 0.5 CPU plus the driver fit on a 2-core machine.
    - Either way the workers' output is not forwarded to this process: worker groups started with a
      `log_dir` write it there (the trainer: `<trainer.output_dir>/logs`), Ray's own session logs keep
      the rest; and this process's SIGTERM/SIGUSR1 handlers (megarl's stop signals) survive `ray.init`.
    """
    if ray.is_initialized():
        return
    # workers' output stays out of the driver's console: worker groups write it to their own logs
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
    # ray.init replaces SIGTERM's handler (with sys.exit): a handler of this process's own stays
    handlers = {sig: signal.getsignal(sig) for sig in _KEPT_SIGNALS}
    try:
        if named_cluster_address() is not None:
            ray.init(address="auto", **quiet)  # resolves RAY_ADDRESS; "auto" also enables token auth
            return
        cpus = num_cpus if num_cpus is not None else max(8, os.cpu_count() or 1)
        # Ray 2.60 announces on every local start that token auth is on by default: a notice, not a problem
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        _bind_loopback()
        # "local": a new cluster even where another runs or a stale record names one
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            _system_config={"enable_metrics_collection": False},
            **quiet,
        )
    finally:
        for sig, handler in handlers.items():
            if callable(handler) and threading.current_thread() is threading.main_thread():
                signal.signal(sig, handler)


LOOPBACK = "127.0.0.1"
_KEPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _bind_loopback() -> None:
    """Make the private cluster's node address 127.0.0.1: Ray turns a loopback node address into the
    machine's own unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is off (read once, when ray is imported,
    hence the constant too); with it off, Ray's agents bind 127.0.0.1 instead of every interface. The
    variable also reaches the processes the cluster starts."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def named_cluster_address(probe_timeout_s: float = 3.0) -> str | None:
    """The cluster `RAY_ADDRESS` names, once it answers; None when it names none (start a private one)."""
    from ray._common.network_utils import parse_address

    named = address = os.environ.get("RAY_ADDRESS", "").strip()
    if address in ("", "local"):
        return None
    if address == "auto":  # asked for: the cluster running on this machine (the last `ray start --head`)
        from ray._private.services import get_ray_address_from_environment

        try:
            address = get_ray_address_from_environment("auto", None)
        except ConnectionError:
            raise ResourcePoolError(
                "RAY_ADDRESS=auto: no Ray cluster runs on this machine; start one (ray start --head), "
                "name one (RAY_ADDRESS=host:port), or unset RAY_ADDRESS to run on a private one"
            ) from None
    if "://" in address:  # a Ray client address (ray://…): ray.init bounds its own connect
        return address
    host_port = parse_address(address)
    if host_port is None:
        raise ResourcePoolError(f"RAY_ADDRESS={named} is not host:port (e.g. 10.0.0.1:6379)")
    try:
        socket.create_connection((host_port[0], int(host_port[1])), timeout=probe_timeout_s).close()
    except (OSError, ValueError):
        raise ResourcePoolError(
            f"RAY_ADDRESS={named} does not answer (nothing listens on {address}); start that cluster, or "
            "unset RAY_ADDRESS to run on a private one"
        ) from None
    return address


def cluster_address() -> str:
    """host:port of the GCS of the cluster this process is connected to (what RAY_ADDRESS names)."""
    return ray.get_runtime_context().gcs_address


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its bundle, and its node (for MASTER_ADDR and LOCAL_RANK)."""

    placement_group: PlacementGroup
    bundle_index: int
    node_id: str
    node_ip: str
    local_rank: int


class ResourcePool:
    """Devices reserved for worker groups: `nodes[i]` devices (GPUs, or CPU slots) on the i-th node.

    Placement groups are sorted by (node IP, node ID) once they are placed, so rank order is the same
    from run to run. With GPUs each bundle is {"GPU": 1, "CPU": cpus_per_rank}; without, {"CPU":
    cpus_per_rank}. `use_gpu=None` means "if the cluster has GPUs". Up to `max_colocate` worker
    groups (or colocated actor sets) may share the pool.
    """

    def __init__(
        self,
        nodes: list[int],
        use_gpu: bool | None = None,
        cpus_per_rank: float = CPUS_PER_RANK,
        name: str = "megarl",
        max_colocate: int = 4,
        ready_timeout_s: float = 60.0,
    ) -> None:
        if not nodes or any(n < 1 for n in nodes):
            raise ResourcePoolError(f"nodes={nodes} must list at least one node with >= 1 device")
        if not ray.is_initialized():
            raise ResourcePoolError("Ray is not running; call start_local_ray() or ray.init() first")
        self.name = name
        self.cpus_per_rank = cpus_per_rank
        self.max_colocate = max_colocate
        self.use_gpu = ray.cluster_resources().get("GPU", 0) > 0 if use_gpu is None else use_gpu
        bundle = {"GPU": 1.0, "CPU": cpus_per_rank} if self.use_gpu else {"CPU": cpus_per_rank}
        groups = [
            placement_group([dict(bundle)] * n, strategy="STRICT_PACK", name=f"{name}-node{i}")
            for i, n in enumerate(nodes)
        ]
        try:
            ray.get([pg.ready() for pg in groups], timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for pg in groups:
                remove_placement_group(pg)
            raise ResourcePoolError(
                f"pool {name!r} ({nodes} x {bundle}) was not placed within {ready_timeout_s:.0f}s; "
                f"the cluster has {ray.available_resources()} free. Lower trainer.n_devices_per_node (or the "
                "roles' n_devices), or add nodes or GPUs to the cluster"
            ) from None
        self._placements = _placements(groups)
        self._groups = groups
        self._users = 0
        self._removed = False

    @property
    def world_size(self) -> int:
        return len(self._placements)

    def placements(self) -> list[Placement]:
        """Everything about where each rank runs, in rank order."""
        return list(self._placements)

    def attach(self) -> None:
        """Reserve one colocation slot (worker groups call this when they start their actors)."""
        if self._removed:
            raise ResourcePoolError(f"pool {self.name!r} was removed")
        if self._users >= self.max_colocate:
            raise ResourcePoolError(
                f"pool {self.name!r} already hosts {self._users} worker groups (max_colocate="
                f"{self.max_colocate}); shut one down, colocate roles in one process with "
                "make_colocated_groups, or build the pool with a larger max_colocate"
            )
        self._users += 1

    def detach(self) -> None:
        self._users = max(0, self._users - 1)

    def actor_resources(self) -> dict[str, float]:
        """num_cpus / num_gpus for one actor: a 1 / max_colocate share of its bundle."""
        share = 1.0 / self.max_colocate
        return {"num_cpus": self.cpus_per_rank * share, "num_gpus": share if self.use_gpu else 0.0}

    def remove(self) -> None:
        """Release the placement groups (actors still inside them are killed by Ray)."""
        if self._removed:
            return
        self._removed = True
        for pg in self._groups:
            remove_placement_group(pg)

    def __enter__(self) -> ResourcePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _placements(groups: list[PlacementGroup]) -> list[Placement]:
    node_ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    placed = []
    for pg in groups:
        node_of = ray.util.placement_group_table(pg)["bundles_to_node_id"]
        node_id = node_of[0]
        placed.append((node_ips.get(node_id, ""), node_id, pg))
    placed.sort(key=lambda item: (_ip_key(item[0]), item[1]))
    local_counts: dict[str, int] = {}
    result = []
    for ip, node_id, pg in placed:
        for index in range(pg.bundle_count):
            local_rank = local_counts.get(node_id, 0)
            local_counts[node_id] = local_rank + 1
            result.append(Placement(pg, index, node_id, ip, local_rank))
    return result


def _ip_key(ip: str) -> tuple:
    """Numeric order for IPv4 (10.0.0.9 before 10.0.0.10); plain string order otherwise."""
    parts = ip.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        return (0, *map(int, parts))
    return (1, ip)
