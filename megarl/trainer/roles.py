"""The worker groups of an RL run, built from the config, and their shutdown.

- actor + reference: ONE process per rank (the reference lives in the actor's processes and layout);
- critic and reward model: each its own group. Under Ray they run on the actor's pool (their own
  processes beside the actor's, with their own layout) or on a pool of their own when
  `<role>.n_devices` is set; under torchrun every role is a worker in each process and so shares the
  actor's layout (config validation says so before anything starts).

`trainer.launcher=ray` starts (or joins) Ray and places every group through a ResourcePool;
`trainer.launcher=torchrun` builds SPMD groups in this process (this process is one rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig


@dataclass
class Roles:
    actor: Any
    ref: Any | None = None
    critic: Any | None = None
    reward_model: Any | None = None
    is_writer: bool = True  # this process writes logs and files (the driver, or rank 0 under torchrun)
    pools: tuple = ()

    def shutdown(self) -> None:
        """End every group's processes (Ray) or tear down this rank's workers (SPMD); idempotent."""
        for group in (self.reward_model, self.critic, self.ref, self.actor):
            if group is not None:
                try:
                    group.shutdown()
                except Exception:  # one group failing to stop must not leave the others running
                    pass
        for pool in self.pools:
            try:
                pool.remove()
            except Exception:  # must not hide the error that ended the run
                pass
        self.actor = self.ref = self.critic = self.reward_model = None
        self.pools = ()


def is_writer_process(cfg: MegarlConfig) -> bool:
    """Whether this process writes logs and files, known before any worker starts: the driver under
    Ray, rank 0 under torchrun (what `Roles.is_writer` says once the groups are up)."""
    return cfg.trainer.launcher != "torchrun" or int(os.environ.get("RANK", "0")) == 0


def enabled_roles(cfg: MegarlConfig) -> list[str]:
    """The roles `build_roles` starts for `cfg` (resolved), in start order."""
    return ["actor"] + [role for role in ("ref", "critic", "reward") if getattr(cfg, role).enable]


def build_roles(cfg: MegarlConfig, total_steps: int) -> Roles:
    """Start every worker group `cfg` (resolved) needs; on failure, whatever started is shut down."""
    from megarl.controller.group import make_colocated_groups, make_worker_group
    from megarl.workers.actor import ActorWorker
    from megarl.workers.critic import CriticWorker
    from megarl.workers.reference import ReferenceWorker

    backend = "spmd" if cfg.trainer.launcher == "torchrun" else "ray"
    # Ray: the driver's deadline per call (and start); both: every process group's collective timeout
    timeouts = {
        "call_timeout_s": cfg.trainer.worker_timeout_s,
        "start_timeout_s": cfg.trainer.worker_timeout_s,
    }
    if backend == "ray":  # each rank's output to its log (under torchrun the rank redirected at start)
        from megarl.observe.worker_logs import logs_dir

        timeouts["log_dir"] = str(logs_dir(cfg.trainer.output_dir))
    roles = Roles(actor=None)
    pools: dict[str, Any] = {}

    def pool_for(role: str) -> Any:
        """The actor's pool, or one of the role's own when `<role>.n_devices` is set."""
        if backend == "spmd":
            return None
        key = role if role != "actor" and getattr(cfg, role).n_devices is not None else "actor"
        if key not in pools:
            pools[key] = _ray_pool(cfg, cfg.world_size(key), name=f"megarl-{key}")
        return pools[key]

    try:
        colocated = {"actor": (ActorWorker, {"spec": role_spec(cfg, "actor", total_steps)})}
        if cfg.ref.enable:
            colocated["ref"] = (ReferenceWorker, {"spec": role_spec(cfg, "ref")})
        groups = make_colocated_groups(backend, pool_for("actor"), colocated, **timeouts)
        roles.actor, roles.ref = groups["actor"], groups.get("ref")
        if cfg.critic.enable:
            spec = role_spec(cfg, "critic", total_steps)
            roles.critic = make_worker_group(
                backend, pool_for("critic"), CriticWorker, "critic", {"spec": spec}, **timeouts
            )
        if cfg.reward.enable:
            cls, kwargs = _reward_worker(cfg)
            roles.reward_model = make_worker_group(
                backend, pool_for("reward"), cls, "reward", kwargs, **timeouts
            )
    except BaseException:
        roles.pools = tuple(pools.values())
        roles.shutdown()
        raise
    roles.pools = tuple(pools.values())
    if backend == "spmd":
        import torch.distributed as dist

        roles.is_writer = dist.get_rank() == 0
    return roles


def _reward_worker(cfg: MegarlConfig) -> tuple[type, dict]:
    from megarl.workers.reward import reward_worker

    return reward_worker(cfg)


def _ray_pool(cfg: MegarlConfig, devices: int, name: str) -> Any:
    from megarl.controller.resource_pool import ResourcePool, start_local_ray

    start_local_ray()
    per_node = cfg.trainer.n_devices_per_node
    nodes = [per_node] * (devices // per_node) + ([devices % per_node] if devices % per_node else [])
    return ResourcePool(nodes, name=name)
