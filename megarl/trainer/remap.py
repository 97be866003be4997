"""Moving a trained role to other devices or another TP/PP/DP layout while the run goes on.

    report = trainer.remap("actor", DeviceMap("dp", ["cpu:0", "cpu:1"]))   # TP2 → TP1 × DP2
    report = trainer.remap("actor", {"tp": 1})                               # a new layout, same devices
    report = trainer.remap("critic", ParallelConfig(tp=2))

1. the new config is built and checked as a run's config is (`validate`: divisibility, heads, device
   counts, the pools): a bad target raises ConfigError with every running process untouched;
2. the role saves its full training state (a role checkpoint: weights, optimizer, LR schedule, RNG and
   counters) to /dev/shm/megarl-remap-<run>/ when it fits there and every rank is on this node, else to
   <output_dir>/remap/;
3. its worker group is shut down (the actor's with its colocated reference and rollout engine), a new one
   starts at the new layout and loads that state (resharded as a resume at another layout is), and the
   temporary copy is deleted;
4. the trainer's config records the new layout (the next checkpoint's config.yaml, the run's config.yaml
   and run_info.json), and the step graph's handles now reach the new processes.

The rollout engine comes back at the next generate (it starts lazily, as at a run's start). Ray only:
under torchrun every process is a rank of every role, so another layout needs other processes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megarl.atomic_write import write_text_atomically
from megarl.config.errors import ConfigError
from megarl.config.placement import placement
from megarl.config.schema import MegarlConfig, ParallelConfig
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.output_guard import free_bytes, human_bytes

if TYPE_CHECKING:
    from megarl.controller.device_map import DeviceMap
    from megarl.trainer.rl_trainer import RLTrainer

REMAPPABLE = ("actor", "critic")  # the trained roles; the reference moves with the actor
SHM_ROOT = Path("/dev/shm")
# a role's state against its HF weights: fp32 weights and Adam's two moments of a bf16 file, plus room
STATE_OVER_HF_BYTES = 8


class RemapError(MegarlError, ValueError):
    """A remap that cannot be made here; nothing was stopped."""

    exit_code = EXIT_USAGE


def remapped_config(cfg: MegarlConfig, role: str, target: DeviceMap | ParallelConfig | dict) -> MegarlConfig:
    """A copy of `cfg` with `role` at `target` (a DeviceMap: devices and layout; a ParallelConfig or a dict
    of its fields: the layout on the same devices), checked as a run's config is. The other roles keep
    their devices. Raises RemapError (a role or launcher that cannot move) or ConfigError (the new
    layout), before anything runs."""
    from megarl.config.validate import validate
    from megarl.controller.device_map import DeviceMap

    if role not in REMAPPABLE:
        moves = "the reference moves with the actor (its processes)" if role == "ref" else "it is not trained"
        raise RemapError(
            f"remap({role!r}): only the trained roles move at runtime ({', '.join(REMAPPABLE)}); {moves}"
        )
    if not getattr(cfg, role, None) or (role != "actor" and not getattr(cfg, role).enable):
        raise RemapError(f"remap({role!r}): this run has no {role} ({role}.enable=false)")
    if cfg.trainer.launcher != "ray":
        raise RemapError(
            f"remap({role!r}) needs trainer.launcher=ray: under torchrun every process is a rank of every "
            "role, so another layout needs other processes. Save a checkpoint and resume it with the new "
            f"{role}.parallel (checkpoints load at any layout)"
        )
    new = copy.deepcopy(cfg)
    before = placement(cfg)
    if isinstance(target, DeviceMap):
        if target.strategy == "fsdp" and cfg.backend_of(role) != "fsdp":
            raise RemapError(
                f"remap({role!r}, {target}): a remap keeps the role's backend ({cfg.backend_of(role)}); "
                "switching to fsdp needs a new run"
            )
        _pin_other_roles(new, role, before)
        target.apply(new, role)
    else:
        fields = target if isinstance(target, dict) else vars(target)
        unknown = sorted(set(fields) - set(vars(ParallelConfig())))
        if unknown:
            raise RemapError(
                f"remap({role!r}, {target}): {', '.join(unknown)} are no {role}.parallel keys; use "
                f"{', '.join(vars(ParallelConfig()))}, or a DeviceMap to change the devices too"
            )
        getattr(new, role).parallel = ParallelConfig(**{**vars(getattr(cfg, role).parallel), **fields})
    validate(new)  # ConfigError listing every problem (layout against the model, batch splits, pools)
    after = placement(new)
    moved = [
        r
        for r in (p for pool in before.pools for p in pool.roles)
        if r not in (role, "ref") and _devices(before, r) != _devices(after, r)
    ]
    if moved:
        raise RemapError(
            f"remap({role!r}) would move {', '.join(moved)} too (its devices follow the {role}'s); give "
            f"{', '.join(r + '.devices' for r in moved)} explicitly, or remap onto the {role}'s devices"
        )
    return new


def _pin_other_roles(cfg: MegarlConfig, role: str, plan: Any) -> None:
    """The roles whose devices follow another's (unset devices) keep the ones they run on now."""
    for pool in plan.pools:
        for other in pool.roles:
            section = getattr(cfg, "reward" if other == "reward" else other)
            if other in (role, "ref") or section.devices is not None or not pool.devices:
                continue
            if getattr(section, "n_devices", None) is None:
                section.devices = [str(d) for d in pool.devices]
    if role == "actor" and cfg.ref.enable and cfg.ref.devices is None:
        cfg.ref.devices = None  # the reference stays in the actor's processes, wherever they go


def _devices(plan: Any, role: str) -> Any:
    try:
        pool = plan.pool_of(role)
    except KeyError:
        return None
    return pool.devices or (pool.name, pool.size)


def scratch_dir(output_dir: Path, run: str, need: int, one_node: bool) -> tuple[Path, str]:
    """Where the role's state goes for the move: (dir, "memory" | "disk"). /dev/shm when every rank is on
    this node and its free space holds `need` bytes twice over; else under the run's output directory."""
    shm = SHM_ROOT / f"megarl-remap-{run}"
    free = free_bytes(SHM_ROOT) if SHM_ROOT.is_dir() else None
    if one_node and free is not None and free > 2 * need:
        return shm, "memory"
    return output_dir / "remap", "disk"


def state_bytes_estimate(model_path: str) -> int:
    """A role's training state for the model at `model_path`, from its HF weight files."""
    files = [*Path(model_path).glob("*.safetensors"), *Path(model_path).glob("*.bin")]
    return STATE_OVER_HF_BYTES * sum(f.stat().st_size for f in files)


def remap_role(trainer: RLTrainer, role: str, target: DeviceMap | ParallelConfig | dict) -> dict[str, Any]:
    """`trainer.remap`: see the module doc. Returns {role, from, to, seconds, bytes, where, path, rng}."""
    from megarl.config.roles import role_spec

    cfg = trainer.cfg
    new_cfg = remapped_config(cfg, role, target)
    start = time.perf_counter()
    before, after = describe_layout(cfg, role), describe_layout(new_cfg, role)
    group = getattr(trainer.roles, role)
    run = Path(cfg.trainer.output_dir).name or "run"
    need = state_bytes_estimate(role_spec(cfg, role).model.path)
    scratch, where = scratch_dir(Path(cfg.trainer.output_dir), run, need, cfg.trainer.nnodes == 1)
    role_dir = scratch / f"{role}-{os.getpid()}-{time.monotonic_ns()}"
    with trainer.log.task(f"megarl: remapping the {role}: {before} → {after} (state via {where}, {scratch})"):
        reports = group.save_checkpoint(str(role_dir), {"step": trainer.done_step, "remap": True})
        written = sum(r.get("bytes_written", 0) for r in reports)
        try:
            same_devices = _devices(placement(cfg), role) == _devices(placement(new_cfg), role)
            _restart_role(trainer, role, new_cfg, same_devices)
            loaded = getattr(trainer.roles, role).load_checkpoint(str(role_dir))
        except BaseException as e:
            raise RemapError(
                f"remap({role!r}) failed after the {role}'s old processes stopped ({type(e).__name__}: {e}); "
                f"its state at step {trainer.done_step} stays in {role_dir}: copy it to "
                f"<run>/checkpoints/step_<N>/{role} or resume the run's last checkpoint"
            ) from e
    shutil.rmtree(role_dir, ignore_errors=True)
    if scratch.is_dir() and not any(scratch.iterdir()):
        scratch.rmdir()
    seconds = time.perf_counter() - start
    _record_layout(trainer, new_cfg)
    if role == "actor":
        _rebalance(trainer.flow, trainer.cfg)
    rng = loaded[0].get("rng", "") if loaded and isinstance(loaded[0], dict) else ""
    trainer.log.message(
        f"megarl: remapped the {role} at step {trainer.done_step}: {before} → {after}; moved "
        f"{human_bytes(written)} of training state via {where} ({role_dir.parent}) in {seconds:.1f} s"
    )
    return {
        "role": role,
        "from": before,
        "to": after,
        "seconds": seconds,
        "bytes": written,
        "where": where,
        "path": str(role_dir.parent),
        "rng": rng,
    }


def _restart_role(trainer: RLTrainer, role: str, new_cfg: MegarlConfig, same_devices: bool) -> None:
    """Stop the role's group (the actor's: with its colocated reference and engine) and start the new
    one, on the same pool when the devices stay; the handles the step graph holds take over the new
    processes."""
    from megarl.trainer.roles import start_role_groups

    roles = trainer.roles
    group = getattr(roles, role)
    # (with LoRA the reference is the actor's own group: one handle)
    ref_apart = roles.ref is not None and roles.ref is not group
    old = [group] + ([roles.ref] if role == "actor" and ref_apart and _colocated(group, roles.ref) else [])
    pool = group.pool
    others = [
        g for name in ("actor", "ref", "critic", "reward_model") if (g := getattr(roles, name)) is not None
    ]
    shared = any(g.pool is pool for g in others if all(g is not o for o in old))
    group.shutdown()  # colocated views share the processes: one shutdown ends them all
    if not same_devices and not shared:
        pool.remove()  # its devices may be the new ones
        roles.pools = tuple(p for p in roles.pools if p is not pool)
    new_groups, new_pool = start_role_groups(
        new_cfg, role, trainer.total_steps, pool if same_devices else None, with_ref=len(old) > 1
    )
    if new_pool is not pool:
        roles.pools = (*roles.pools, new_pool)
    for handle in old:
        handle.adopt(new_groups[handle.role])
    if role == "actor" and roles.rollout is not None:  # the engines' own pool: the bridge to the new ranks
        from megarl.trainer.roles import join_bridge

        join_bridge(new_cfg, roles.actor, roles.rollout)


def _colocated(actor: Any, ref: Any) -> bool:
    """The reference lives in the actor's processes (one set of Ray actors behind both views)."""
    return ref is not None and actor.processes == ref.processes


def _record_layout(trainer: RLTrainer, new_cfg: MegarlConfig) -> None:
    """The trainer's config becomes `new_cfg` in place (stages holding it see the new layout), and the
    run's config.yaml and run_info.json say so."""
    from megarl.config import config_to_yaml
    from megarl.observe.machine import role_layouts
    from megarl.observe.run_files import CONFIG, RUN_INFO

    cfg = trainer.cfg
    for name in vars(new_cfg):
        setattr(cfg, name, getattr(new_cfg, name))
    if not trainer.is_writer:
        return
    out = Path(cfg.trainer.output_dir)
    if (out / CONFIG).is_file():
        write_text_atomically(out / CONFIG, config_to_yaml(cfg))
    if (out / RUN_INFO).is_file():
        try:
            info = json.loads((out / RUN_INFO).read_text())
        except (OSError, json.JSONDecodeError):
            return
        info["layout"] = role_layouts(cfg)
        write_text_atomically(out / RUN_INFO, json.dumps(info, indent=2) + "\n")


def _rebalance(flow: Any, cfg: MegarlConfig) -> None:
    """trainer.balance_batch splits each step's rollouts over the actor's DP ranks: the stage follows
    the new DP size (added, replaced or dropped) as a run started at this layout would have it."""
    from megarl.trainer.rl_stages import balance_stage

    dp = cfg.layout("actor").dp
    want = cfg.trainer.balance_batch and dp > 1
    if "balance_batch" in flow:
        if want:
            flow.replace("balance_batch", balance_stage(dp))
        else:
            flow.remove("balance_batch")
    elif want:
        after = next((name for name in ("filter_groups", "token_rewards", "reward") if name in flow), None)
        if after is not None:
            flow.insert_after(after, balance_stage(dp))


def describe_layout(cfg: MegarlConfig, role: str) -> str:
    """`tp2 pp1 dp1 on cpu:0,cpu:1` (the devices when the config names them, else their count)."""
    devices = getattr(cfg, role).devices
    where = ",".join(devices) if devices else f"{cfg.world_size(role)} devices"
    return f"{cfg.layout(role).describe()} on {where}"


def refused(error: ConfigError | RemapError, role: str) -> str:
    """The line a refused remap is reported with."""
    return f"megarl: remap({role!r}) refused, nothing was stopped: {error}"
