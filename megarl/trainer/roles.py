"""The worker groups of an RL run, built from the config, and their shutdown.

- actor + reference: ONE process per rank (the reference lives in the actor's processes and layout),
  unless `ref.devices` names devices of its own: then the reference is its own group there;
- critic and reward model: each its own group. Under Ray each group is built on its pool from
  `megarl.config.placement` (roles on the same devices share a pool: their own processes beside the
  actor's, with their own layout; disjoint devices, or `<role>.n_devices`, a pool of its own); under
  torchrun every role is a worker in each process and so shares the actor's layout (config validation
  says so before anything starts).

`trainer.launcher=ray` starts (or joins) Ray and places every group through a ResourcePool;
`trainer.launcher=torchrun` builds SPMD groups in this process (this process is one rank).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from megarl.config.placement import Pool, placement
from megarl.config.placement import enabled_roles as placed_roles
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
from megarl.workers.groups import (
    ActorGroup,
    CriticGroup,
    RefGroup,
    RewardModelGroup,
    RewardTrainerGroup,
    RolloutGroup,
)


@dataclass
class RoleGroups:
    """The worker groups of one run, each seen through its role's typed handle."""

    actor: ActorGroup
    ref: RefGroup | None = None
    critic: CriticGroup | None = None
    reward_model: RewardModelGroup | None = None
    rollout: RolloutGroup | None = None  # the engines' own pool (rollout.placement=separate)
    is_writer: bool = True  # this process writes logs and files (the driver, or rank 0 under torchrun)
    pools: tuple = ()
    # roles whose groups outlive the run: the Python API's controllers own them and stop them at their
    # close() (the reference lives in the actor's processes, so it stays with the actor)
    detached: frozenset[str] = frozenset()

    def shutdown(self) -> None:
        """End every group's processes (Ray) or tear down this rank's workers (SPMD), the detached roles'
        excepted; idempotent."""
        if self.detached:
            kept = self.detached | ({"ref"} if "actor" in self.detached else set())
            groups = {
                "rollout": self.rollout,
                "reward_model": self.reward_model,
                "critic": self.critic,
                "ref": self.ref,
                "actor": self.actor,
            }
            _shutdown([g for role, g in groups.items() if role not in kept], ())
            return
        _shutdown([self.rollout, self.reward_model, self.critic, self.ref, self.actor], self.pools)
        self.pools = ()

    def stop(self, role: str) -> None:
        """Stop one detached role's group; the pools go with the last of them."""
        group = getattr(self, role)
        _shutdown([group, self.ref] if role == "actor" else [group], ())
        self.detached = self.detached - {role}
        if not self.detached:
            _shutdown([], self.pools)
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
    return placed_roles(cfg)


def build_roles(cfg: MegarlConfig, total_steps: int) -> RoleGroups:
    """Start every worker group `cfg` (resolved) needs; on failure, whatever started is shut down."""
    from megarl.fsdp.checks import check_fsdp_roles
    from megarl.workers.reward_trainer import RewardTrainerWorker

    backend = group_backend(cfg)
    options = group_options(cfg)
    plan = placement(cfg)  # a ConfigError here, before any process starts
    check_fsdp_roles(cfg)  # each FSDP role's model loadable (meta device), before any process starts
    pools: dict[str, Any] = {}
    started: list[WorkerGroup] = []  # shut down, last first, when a later role fails to start

    def pool_for(role: str) -> Any:
        """The Ray pool of the role's devices, shared with the roles on the same devices."""
        if backend == "spmd":
            return None
        pool = plan.pool_of(role)
        if pool.name not in pools:
            pools[pool.name] = _ray_pool(pool)
        return pools[pool.name]

    try:
        # the rm job trains a reward model in the actor's place (its layout, batching and optimizer)
        trains_rm = cfg.algorithm.name == "rm"
        actor_cls = RewardTrainerWorker if trains_rm else worker_class(cfg, "actor")
        ReferenceWorker, CriticWorker = worker_class(cfg, "ref"), worker_class(cfg, "critic")
        colocated: dict[str, tuple[type, dict]] = {
            "actor": (actor_cls, {"spec": role_spec(cfg, "actor", total_steps)})
        }
        ref_own = cfg.ref.enable and backend == "ray" and not plan.ref_in_actor_processes
        # with LoRA the actor, its adapters off, is the reference: no second model in its processes
        ref_is_actor = cfg.ref.enable and not ref_own and _actor_lora(cfg) and not trains_rm
        if cfg.ref.enable and not ref_own and not ref_is_actor:
            colocated["ref"] = (ReferenceWorker, {"spec": role_spec(cfg, "ref")})
        groups = make_colocated_groups(backend, pool_for("actor"), colocated, **options)
        started.append(groups["actor"])
        if trains_rm:  # RewardModelTrainer sees it as the RewardTrainerGroup it is
            actor = cast(ActorGroup, as_handle(groups["actor"], RewardTrainerGroup))
        else:
            actor = as_handle(groups["actor"], ActorGroup)
        ref = as_handle(groups["ref"], RefGroup) if "ref" in groups else None
        if ref_is_actor:
            ref = as_handle(groups["actor"], RefGroup)
        if ref_own:
            group = make_worker_group(
                backend, pool_for("ref"), ReferenceWorker, "ref", {"spec": role_spec(cfg, "ref")}, **options
            )
            started.insert(0, group)
            ref = as_handle(group, RefGroup)
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
        rollout: RolloutGroup | None = None
        if "rollout" in plan.pools_roles:
            rollout = _start_rollout_pool(cfg, actor, pool_for("rollout"), options)
            started.insert(0, rollout)  # type: ignore[arg-type]
    except BaseException:
        _shutdown(started, tuple(pools.values()))
        raise
    is_writer = True
    if backend == "spmd":
        import torch.distributed as dist

        is_writer = dist.get_rank() == 0
    return RoleGroups(actor, ref, critic, reward_model, rollout, is_writer, tuple(pools.values()))


def _actor_lora(cfg: MegarlConfig) -> bool:
    return cfg.actor.backend == "megatron" and cfg.actor.lora.rank > 0


def _start_rollout_pool(cfg: MegarlConfig, actor: ActorGroup, pool: Any, options: dict) -> RolloutGroup:
    """The engines' worker group on their own pool, joined to the actor's ranks by the weight bridge."""
    from megarl.config.roles import rollout_spec
    from megarl.workers.rollout_worker import RolloutWorker

    group = as_handle(
        make_worker_group("ray", pool, RolloutWorker, "rollout", {"spec": rollout_spec(cfg)}, **options),
        RolloutGroup,
    )
    try:
        join_bridge(cfg, actor, group)
    except BaseException:
        group.shutdown()
        raise
    return group


def join_bridge(cfg: MegarlConfig, actor: ActorGroup, rollout: RolloutGroup) -> None:
    """Connect the actor's ranks and the engines' by the weight bridge (megarl.hybrid.pool_bridge), its
    store served by the actor's rank 0: at start, and again after the actor is remapped."""
    host, port = actor.free_port_on_rank0()  # type: ignore[attr-defined]  # a RayWorkerGroup's
    joined = [
        actor.join_bridge_async(host, port, rollout.world_size, cfg.rollout.tp),
        rollout.join_bridge_async(host, port, actor.world_size),
    ]
    for future in joined:
        future.result()


def start_role_groups(
    cfg: MegarlConfig, role: str, total_steps: int, pool: Any = None, with_ref: bool = False
) -> tuple[dict[str, WorkerGroup], Any]:
    """One trained role's group(s) again (a remap, megarl.trainer.remap): "actor" (with the reference in
    its processes when `with_ref`) or "critic", under Ray, on `pool` or, when None, on a new pool of the
    role's devices in `cfg`. Returns ({role: group}, the pool)."""
    plan = placement(cfg)
    own = None
    if pool is None:
        planned = plan.pool_of(role)
        own = pool = _ray_pool(planned, name=f"megarl-{planned.name}-{os.getpid()}-{id(cfg):x}")
    roles = {role: (worker_class(cfg, role), {"spec": role_spec(cfg, role, total_steps)})}
    if with_ref and not (role == "actor" and _actor_lora(cfg)):
        roles["ref"] = (worker_class(cfg, "ref"), {"spec": role_spec(cfg, "ref")})
    try:
        groups = make_colocated_groups("ray", pool, roles, **group_options(cfg))
    except BaseException:
        if own is not None:
            own.remove()
        raise
    return dict(groups), pool


def worker_class(cfg: MegarlConfig, role: str) -> type:
    """The worker class of `role` ("actor", "ref" or "critic") on its backend (`<role>.backend`)."""
    if cfg.backend_of(role) == "fsdp":
        from megarl.workers import fsdp_roles

        return {
            "actor": fsdp_roles.FSDPActorWorker,
            "ref": fsdp_roles.FSDPReferenceWorker,
            "critic": fsdp_roles.FSDPCriticWorker,
        }[role]
    from megarl.workers.actor import ActorWorker
    from megarl.workers.critic import CriticWorker
    from megarl.workers.reference import ReferenceWorker

    return {"actor": ActorWorker, "ref": ReferenceWorker, "critic": CriticWorker}[role]


def group_backend(cfg: MegarlConfig) -> Backend:
    return "spmd" if cfg.trainer.launcher == "torchrun" else "ray"


def group_options(cfg: MegarlConfig) -> dict[str, float | str]:
    """The worker-group options of a run: Ray's deadline per call (and start) and every process group's
    collective timeout; under Ray each rank's output goes to its log file (under torchrun the rank
    redirected its output at start)."""
    options: dict[str, float | str] = {
        "call_timeout_s": cfg.trainer.worker_timeout_s,
        "start_timeout_s": cfg.trainer.worker_timeout_s,
    }
    if group_backend(cfg) == "ray":
        from megarl.observe.worker_logs import logs_dir

        options["log_dir"] = str(logs_dir(cfg.trainer.output_dir))
    return options


def start_reward_model(
    cfg: MegarlConfig, pools: tuple = (), name: str = "reward"
) -> tuple[RewardModelGroup, Any]:
    """A reward-model group for `cfg.reward` (the Python API's reward controllers beyond the run's own):
    on the running pool of its devices when one of `pools` holds them (colocated), else on a Ray pool
    of its own named after `name`. Returns (typed handle, the new pool to remove after its shutdown, or
    None)."""
    if group_backend(cfg) != "ray":
        raise ValueError("reward controllers started by the Python API need trainer.launcher=ray")
    planned = placement(cfg).pool_of("reward")
    running = {getattr(pool, "name", None): pool for pool in pools}
    pool = running.get(f"megarl-{planned.name}")
    own = None
    if pool is None:
        own = pool = _ray_pool(planned, name=f"megarl-reward-{name}")
    cls, kwargs = _reward_worker(cfg)
    try:
        group = make_worker_group("ray", pool, cls, "reward", kwargs, **group_options(cfg))
    except BaseException:
        if own is not None:
            own.remove()
        raise
    return as_handle(group, RewardModelGroup), own


def _reward_worker(cfg: MegarlConfig) -> tuple[type, dict]:
    from megarl.workers.reward import reward_worker

    return reward_worker(cfg)


def _ray_pool(pool: Pool, name: str | None = None) -> Any:
    from megarl.controller.resource_pool import ResourcePool, start_local_ray

    start_local_ray()
    return ResourcePool(list(pool.nodes), name=name or f"megarl-{pool.name}")
