"""The rules of `<role>.backend` (megatron | fsdp), checked with the rest of the config before anything
starts: an FSDP role is data parallel only; roles sharing processes share one megatron layout, so a
role of the other backend there needs the layout FSDP runs at (TP = PP = CP = 1); the rollout engine's
TP groups of an FSDP actor are runs of consecutive ranks, so rollout.tp divides the actor's devices."""

from __future__ import annotations

import json
from pathlib import Path

from megarl.config.schema import MegarlConfig
from megarl.distributed.fsdp_plan import FSDPGenerationPlan, model_fields

FSDP_ROLES = ("actor", "ref", "critic")


def _fsdp_layout_problems(cfg: MegarlConfig, role: str) -> list[str]:
    """What in the role's layout FSDP cannot do."""
    p = cfg.parallel_of(role)
    key = cfg.parallel_key(role)
    sizes = {"tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep}
    wrong = [f"{key}.{name}={value}" for name, value in sizes.items() if value != 1]
    if p.vpp is not None:
        wrong.append(f"{key}.vpp={p.vpp}")
    if p.sequence_parallel:
        wrong.append(f"{key}.sequence_parallel=true")
    return wrong


def _hf_config(path: str | None) -> dict:
    """config.json of a model directory (its text_config where it nests one); {} when unreadable (the
    model checks say why)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text()) if path else {}
    except (OSError, ValueError):
        return {}
    return config.get("text_config", config)


def check_backends(cfg: MegarlConfig, problems: list[str], check_paths: bool = True) -> None:
    enabled = {"actor": True, "ref": bool(cfg.ref.enable), "critic": bool(cfg.critic.enable)}
    for role in FSDP_ROLES:
        if not enabled[role] or cfg.backend_of(role) != "fsdp":
            continue
        wrong = _fsdp_layout_problems(cfg, role)
        if wrong:
            problems.append(
                f"{role}.backend=fsdp is data parallel only (FSDP shards every parameter over the role's devices), "
                f"but {', '.join(wrong)}; set them to 1 (vpp null, sequence_parallel false) or use "
                f"{role}.backend=megatron for tensor, pipeline, context or expert parallelism"
            )
    if cfg.algorithm.name == "rm" and cfg.actor.backend == "fsdp":
        problems.append(
            "algorithm.name=rm trains a reward model on megatron-core only; set actor.backend=megatron"
        )
    _check_shared_processes(cfg, enabled, problems)
    if cfg.actor.backend == "fsdp" and cfg.algorithm.name != "rm":
        world = cfg.world_size("actor")
        hf_config = _hf_config(cfg.model.path) if check_paths else {}
        if hf_config:
            problems += FSDPGenerationPlan.check(world, cfg.rollout.tp, *model_fields(hf_config))
        else:  # the model's rules wait for its config (checked again when the actor loads it)
            divides = world % cfg.rollout.tp == 0
            problems += [] if divides else FSDPGenerationPlan.check(world, cfg.rollout.tp)[:1]


def _check_shared_processes(cfg: MegarlConfig, enabled: dict[str, bool], problems: list[str]) -> None:
    """Roles in the actor's processes (the colocated reference; every role under torchrun) share its
    megatron layout: mixing backends there needs the actor's layout to be FSDP's."""
    ref_inside = cfg.ref.devices in (None, cfg.actor.devices)
    sharing = ["ref"] if enabled["ref"] and ref_inside else []
    if cfg.trainer.launcher == "torchrun":
        sharing = [r for r in ("ref", "critic") if enabled[r]]
    mixed = [r for r in sharing if cfg.backend_of(r) != cfg.actor.backend]
    if not mixed:
        return
    wrong = _fsdp_layout_problems(cfg, "actor")
    if wrong:
        roles = ", ".join(f"{r}.backend={cfg.backend_of(r)}" for r in mixed)
        problems.append(
            f"{roles} runs in the actor's processes (actor.backend={cfg.actor.backend}), which hold one megatron "
            f"layout; an FSDP role needs it at tp = pp = cp = 1, but {', '.join(wrong)}. Give the role devices "
            "of its own (trainer.launcher=ray) or use one backend"
        )
