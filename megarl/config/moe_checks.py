"""Rules of `actor.router_replay` and `<role>.moe` (megarl.config.schema_moe), applied at load time by
megarl.config.validate."""

from __future__ import annotations

from megarl.config.parallel_checks import ModelDims
from megarl.config.schema import MegarlConfig


def check_router_replay(cfg: MegarlConfig, dims: ModelDims | None, problems: list[str]) -> None:
    """Problems of a router replay mode other than disabled; `dims` = the actor's model (None = unread)."""
    if cfg.critic.router_replay.mode != "disabled":
        problems.append(
            f"critic.router_replay.mode={cfg.critic.router_replay.mode}: only the actor replays routes "
            "(verl's critic has no router_replay); set critic.router_replay.mode=disabled"
        )
    mode = cfg.actor.router_replay.mode
    if mode == "disabled":
        return
    key = f"actor.router_replay.mode={mode}"
    if dims is not None and dims.num_experts == 0:
        problems.append(
            f"{key}: model.path is a dense model (its config.json names no num_experts / num_local_experts); "
            "routing replay is for mixture-of-experts models: set actor.router_replay.mode=disabled"
        )
    for role in ["actor", "ref"] if cfg.ref.enable else ["actor"]:
        if cfg.backend_of(role) != "megatron":
            problems.append(
                f"{key}: the {role} runs on the {cfg.backend_of(role)} backend, and routing replay drives "
                f"megatron-core's routers: use {role}.backend=megatron or actor.router_replay.mode=disabled"
            )
    if cfg.model.gradient_checkpointing and cfg.actor.parallel.pp > 1:
        problems.append(
            f"{key}: with pipeline parallelism the forward recomputed in the backward would meet another "
            "micro-batch's routes; set model.gradient_checkpointing=false or actor.parallel.pp=1"
        )
    if mode == "R3" and cfg.rollout.multi_turn.enable:
        problems.append(
            f"{key}: the engine records routes for single-turn rollouts only; set rollout.multi_turn.enable=false "
            "or use actor.router_replay.mode=R2"
        )
    if mode == "R3" and cfg.async_training.partial_rollout:
        problems.append(
            f"{key}: routes are not recorded across the weight syncs of a partial rollout; set "
            "async_training.partial_rollout=false or use actor.router_replay.mode=R2"
        )
    if mode == "R2" and cfg.algorithm.rollout_correction.bypass_mode:
        problems.append(
            f"{key} records the routes in the old-log-prob forward, which "
            "algorithm.rollout_correction.bypass_mode=true skips: use R3 or bypass_mode=false"
        )
    if mode == "R3" and cfg.rollout.placement != "colocated":
        problems.append(
            f"{key}: the routes come from the actor's colocated engine; a separate rollout pool "
            "(rollout.placement=separate) does not return them yet: use rollout.placement=colocated or R2"
        )


def check_moe_router(cfg: MegarlConfig, problems: list[str]) -> None:
    """Problems of the trained roles' router loss settings (`<role>.moe`)."""
    for role in ("actor", "critic"):
        moe = getattr(cfg, role).moe
        for name in ("aux_loss_coeff", "z_loss_coeff"):
            value = getattr(moe, name)
            if value is not None and value < 0:
                problems.append(
                    f"{role}.moe.{name}={value} must be ≥ 0 (0 = no such loss; unset = the checkpoint's)"
                )


def check_rollout_expert_parallel(cfg: MegarlConfig, dims: ModelDims | None, problems: list[str]) -> None:
    """Problems of `rollout.expert_parallel_size` (vLLM's enable_expert_parallel over the engine's TP ranks);
    `dims` = the actor's model (None = unread)."""
    r = cfg.rollout
    if r.expert_parallel_size == 1:
        return
    key = f"rollout.expert_parallel_size={r.expert_parallel_size}"
    if r.expert_parallel_size != r.tp:
        problems.append(
            f"{key}: an engine's experts split over its TP ranks (vLLM's enable_expert_parallel, one "
            f"replica per engine), so it must equal rollout.tp={r.tp}; set it to {r.tp} or 1"
        )
    if dims is not None and dims.num_experts == 0:
        problems.append(f"{key}: model.path is a dense model; set rollout.expert_parallel_size=1")
    elif dims is not None and dims.num_experts % r.expert_parallel_size:
        problems.append(
            f"{key} does not divide the model's {dims.num_experts} routed experts (each engine rank holds a "
            "contiguous block of whole experts); use a divisor of it or 1"
        )
    if cfg.actor.backend != "megatron" or r.placement != "colocated":
        problems.append(
            f"{key}: only the megarl actor's colocated engine (actor.backend=megatron, "
            "rollout.placement=colocated) sends each engine rank its block of whole experts; set "
            "rollout.expert_parallel_size=1"
        )
