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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.controller.group import (
    Backend,
    GroupHandle,
    WorkerGroup,
    as_handle,
    make_colocated_groups,
    make_worker_group,
)
from megarl.workers.groups import ActorGroup, CriticGroup, RefGroup, RewardModelGroup, RewardTrainerGroup


@dataclass
class RoleGroups:
    """The worker groups of one run, each seen through its role's typed handle."""

    actor: ActorGroup
    ref: RefGroup | None = None
    critic: CriticGroup | None = None
    reward_model: RewardModelGroup | None = None
    is_writer: bool = True  # this process writes logs and files (the driver, or rank 0 under torchrun)
    pools: tuple = ()

    def shutdown(self) -> None:
        """End every group's processes (Ray) or tear down this rank's workers (SPMD); idempotent."""
        _shutdown([self.reward_model, self.critic, self.ref, self.actor], self.pools)
        self.pools = ()


def _shutdown(groups: Sequence[GroupHandle | WorkerGroup | None], pools: tuple) -> None:
    for group in groups:
        if group is not None:
            try:
                group.shutdown()
            except Exception:  # one group failing to stop must not leave the others running
                pass
    for pool in pools:
        try:
            pool.remove()
        except Exception:  # must not hide the error that ended the run
            pass


def is_writer_process(cfg: MegarlConfig) -> bool:
    """Whether this process writes logs and files, known before any worker starts: the driver under
    Ray, rank 0 under torchrun (what `RoleGroups.is_writer` says once the groups are up)."""
    return cfg.trainer.launcher != "torchrun" or int(os.environ.get("RANK", "0")) == 0


def enabled_roles(cfg: MegarlConfig) -> list[str]:
    """The roles `build_roles` starts for `cfg` (resolved), in start order."""
    return ["actor"] + [role for role in ("ref", "critic", "reward") if getattr(cfg, role).enable]


def build_roles(cfg: MegarlConfig, total_steps: int) -> RoleGroups:
    """Start every worker group `cfg` (resolved) needs; on failure, whatever started is shut down."""
    from megarl.workers.actor import ActorWorker
    from megarl.workers.critic import CriticWorker
    from megarl.workers.reference import ReferenceWorker
    from megarl.workers.reward_trainer import RewardTrainerWorker

    backend: Backend = "spmd" if cfg.trainer.launcher == "torchrun" else "ray"
    # Ray: the driver's deadline per call (and start); both: every process group's collective timeout
    options: dict[str, float | str] = {
        "call_timeout_s": cfg.trainer.worker_timeout_s,
        "start_timeout_s": cfg.trainer.worker_timeout_s,
    }
    if backend == "ray":  # each rank's output to its log (under torchrun the rank redirected at start)
        from megarl.observe.worker_logs import logs_dir

        options["log_dir"] = str(logs_dir(cfg.trainer.output_dir))
    pools: dict[str, Any] = {}
    started: list[WorkerGroup] = []  # shut down, last first, when a later role fails to start

    def pool_for(role: str) -> Any:
        """The actor's pool, or one of the role's own when `<role>.n_devices` is set."""
        if backend == "spmd":
            return None
        key = role if role != "actor" and getattr(cfg, role).n_devices is not None else "actor"
        if key not in pools:
            pools[key] = _ray_pool(cfg, cfg.world_size(key), name=f"megarl-{key}")
        return pools[key]

    try:
        # the rm job trains a reward model in the actor's place (its layout, batching and optimizer)
        trains_rm = cfg.algorithm.name == "rm"
        actor_cls = RewardTrainerWorker if trains_rm else ActorWorker
        colocated: dict[str, tuple[type, dict]] = {
            "actor": (actor_cls, {"spec": role_spec(cfg, "actor", total_steps)})
        }
        if cfg.ref.enable:
            colocated["ref"] = (ReferenceWorker, {"spec": role_spec(cfg, "ref")})
        groups = make_colocated_groups(backend, pool_for("actor"), colocated, **options)
        started.append(groups["actor"])
        if trains_rm:  # RewardModelTrainer sees it as the RewardTrainerGroup it is
            actor = cast(ActorGroup, as_handle(groups["actor"], RewardTrainerGroup))
        else:
            actor = as_handle(groups["actor"], ActorGroup)
        ref = as_handle(groups["ref"], RefGroup) if "ref" in groups else None
        critic: CriticGroup | None = None
        reward_model: RewardModelGroup | None = None
        if cfg.critic.enable:
            spec = role_spec(cfg, "critic", total_steps)
            group = make_worker_group(
                backend, pool_for("critic"), CriticWorker, "critic", {"spec": spec}, **options
            )
            started.insert(0, group)
            critic = as_handle(group, CriticGroup)
        if cfg.reward.enable:
            cls, kwargs = _reward_worker(cfg)
            group = make_worker_group(backend, pool_for("reward"), cls, "reward", kwargs, **options)
            started.insert(0, group)
            reward_model = as_handle(group, RewardModelGroup)
    except BaseException:
        _shutdown(started, tuple(pools.values()))
        raise
    is_writer = True
    if backend == "spmd":
        import torch.distributed as dist

        is_writer = dist.get_rank() == 0
    return RoleGroups(actor, ref, critic, reward_model, is_writer, tuple(pools.values()))


def _reward_worker(cfg: MegarlConfig) -> tuple[type, dict]:
    from megarl.workers.reward import reward_worker

    return reward_worker(cfg)


def _ray_pool(cfg: MegarlConfig, devices: int, name: str) -> Any:
    from megarl.controller.resource_pool import ResourcePool, start_local_ray

    start_local_ray()
    per_node = cfg.trainer.n_devices_per_node
    nodes = [per_node] * (devices // per_node) + ([devices % per_node] if devices % per_node else [])
    return ResourcePool(nodes, name=name)
