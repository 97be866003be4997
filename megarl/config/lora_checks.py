"""The rules of `<role>.lora` (megarl.config.schema_lora), checked with the rest of the config before
anything starts: the values themselves; a PEFT adapter to start from (its adapter_config.json read as
JSON, nothing imported), which must be what the config describes; and what LoRA does not run with yet
(the fsdp backend, the engines' own pool and what needs it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from megarl.config.errors import at_least, in_range, join, show_value
from megarl.config.schema import MegarlConfig
from megarl.config.schema_lora import (
    ALL_LINEAR,
    MEGATRON_LINEARS,
    PROJECTIONS,
    TARGET_NAMES,
    LoraConfig,
    is_pattern,
)

PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
# what to do with an adapter megarl cannot continue training
MERGE_IT = "merge it into the model (PeftModel.merge_and_unload) and start a new adapter from that"


def check_lora(cfg: MegarlConfig, problems: list[str], check_paths: bool = True) -> None:
    roles = ("actor", "critic") if cfg.critic.enable else ("actor",)
    for role in roles:
        section = getattr(cfg, role)
        key, lora = f"{role}.lora", section.lora
        _check_values(key, lora, problems)
        if lora.rank <= 0:
            if lora.rank == 0 and lora.adapter_path:
                problems.append(
                    f"{key}.adapter_path={lora.adapter_path} is set but {key}.rank={lora.rank} (LoRA off); set "
                    f"{key}.rank and {key}.alpha to the adapter's r and lora_alpha, or remove adapter_path"
                )
            continue
        if section.backend == "fsdp":
            problems.append(
                f"{key}.rank={lora.rank} with {role}.backend=fsdp: megarl's FSDP backend has no LoRA yet; use "
                f"{role}.backend=megatron or {key}.rank=0"
            )
        if lora.adapter_path and check_paths:
            _check_adapter(key, lora, lora.adapter_path, problems)
    if cfg.actor.lora.rank > 0:
        _check_actor_lora(cfg, problems)


def _check_values(key: str, lora: LoraConfig, problems: list[str]) -> None:
    at_least(problems, f"{key}.rank", lora.rank, 0, "e.g. 32 (0 = off)")
    if not lora.alpha > 0:
        problems.append(f"{key}.alpha={lora.alpha} must be > 0 (scaling = alpha / rank); e.g. 32")
    ok = 0 <= lora.dropout < 1
    in_range(problems, f"{key}.dropout", lora.dropout, "[0, 1)", ok, "e.g. 0.0 (off) or 0.05")
    if not lora.target_modules:
        problems.append(
            f"{key}.target_modules is empty, so no projection gets an adapter; use [{ALL_LINEAR}] "
            f"(exclude_modules takes projections out of it)"
        )
    for name in ("target_modules", "exclude_modules"):
        unknown = [e for e in getattr(lora, name) if e not in TARGET_NAMES and not is_pattern(e)]
        if unknown:
            problems.append(
                f"{key}.{name} has {join([repr(e) for e in unknown])}: an entry is one of {join(TARGET_NAMES)}, "
                "or a pattern over full module names (with * or .), e.g. '*.layers.0.*.linear_qkv'"
            )


def _check_actor_lora(cfg: MegarlConfig, problems: list[str]) -> None:
    """What the actor's adapters do not run with yet, and reference settings LoRA makes meaningless."""
    key = f"actor.lora.rank={cfg.actor.lora.rank}"
    a = cfg.async_training
    apart = [
        (f"{k}={show_value(v)}", f"{k}={show_value(off)}")
        for k, v, off in (
            ("rollout.placement", cfg.rollout.placement, "colocated"),
            ("async_training.max_staleness", a.max_staleness, 0),
            ("async_training.partial_rollout", a.partial_rollout, False),
        )
        if v != off
    ]
    if apart:
        given, fixes = zip(*apart, strict=True)
        problems.append(
            f"{key} with {', '.join(given)}: LoRA syncs adapters into colocated engines only, not yet into "
            f"an engines' pool of their own; set {' and '.join(fixes)}, or actor.lora.rank=0"
        )
    if not cfg.ref.enable:
        return
    own = [
        name
        for name, inside in (
            ("ref.devices", cfg.ref.devices in (None, cfg.actor.devices)),
            ("ref.parallel", cfg.ref.parallel in (None, cfg.actor.parallel)),
            ("ref.backend", cfg.ref.backend in (None, cfg.actor.backend)),
        )
        if not inside
    ]
    if own:
        problems.append(
            f"{key}: the reference is the actor with its adapters off (no second model), so {join(own)} "
            f"cannot apply; remove {join(own)}, or set actor.lora.rank=0 for a reference model of its own"
        )


def _check_adapter(key: str, lora: LoraConfig, path: str, problems: list[str]) -> None:
    """The PEFT adapter at `path` (lora.adapter_path): its files, and its config against `lora`."""
    where = f"{key}.adapter_path={path}"
    if not os.path.isdir(path):
        problems.append(f"{where} does not exist; point it at a PEFT adapter directory")
        return
    missing = [f for f in PEFT_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        bin_only = os.path.isfile(os.path.join(path, "adapter_model.bin"))
        fix = (
            "megarl reads safetensors only: re-save it with save_pretrained(..., safe_serialization=True)"
            if bin_only and missing == ["adapter_model.safetensors"]
            else "point it at what PeftModel.save_pretrained writes"
        )
        problems.append(f"{where} has no {' or '.join(missing)}; {fix}")
        return
    try:
        adapter = json.loads((Path(path) / PEFT_FILES[0]).read_text())
    except (OSError, ValueError) as e:
        adapter = f"{type(e).__name__}: {e}"
    if not isinstance(adapter, dict):
        problems.append(
            f"{where}: adapter_config.json is not a JSON mapping ({adapter}); re-save the adapter"
        )
        return
    problems += [f"{where}: {p}" for p in adapter_problems(key, lora, adapter)]


def adapter_problems(key: str, lora: LoraConfig, adapter: dict[str, Any]) -> list[str]:
    """What in a PEFT adapter_config.json megarl cannot load as `lora` (one line each, with the fix)."""
    out = []
    if adapter.get("peft_type", "LORA") != "LORA":
        return [f"its peft_type is {adapter['peft_type']}; megarl loads LoRA adapters only: {MERGE_IT}"]
    r, alpha = adapter.get("r"), adapter.get("lora_alpha")
    if r != lora.rank or alpha is None or float(alpha) != lora.alpha:
        out.append(
            f"the adapter has r={r}, lora_alpha={alpha} but {key}.rank={lora.rank}, {key}.alpha="
            f"{lora.alpha}; set {key}.rank={r} {key}.alpha={alpha}"
        )
    unsupported = {
        "use_rslora": (adapter.get("use_rslora"), "rsLoRA's alpha/√r scaling"),
        "use_dora": (adapter.get("use_dora"), "DoRA"),
        "bias": (adapter.get("bias", "none") != "none", "trained biases"),
        "lora_bias": (adapter.get("lora_bias"), "a bias on lora_B"),
        "modules_to_save": (adapter.get("modules_to_save"), "fully trained modules"),
        "rank_pattern": (adapter.get("rank_pattern"), "per-module ranks"),
        "alpha_pattern": (adapter.get("alpha_pattern"), "per-module alphas"),
        "target_parameters": (adapter.get("target_parameters"), "adapters on parameters, not modules"),
    }
    out += [
        f"its {name}={show_value(adapter[name])} ({what}): megarl's LoRA has none; {MERGE_IT}"
        for name, (present, what) in unsupported.items()
        if present
    ]
    held = adapter.get("target_modules")
    if held == ALL_LINEAR:  # PEFT's: every linear but the output layer
        held = list(PROJECTIONS)
    if isinstance(held, list):  # a regex string is matched against the tensors when they load
        others = sorted(m for m in held if m not in PROJECTIONS)
        if others:
            out.append(
                f"it adapts {join(others)}, but megarl's adapters are on {join(PROJECTIONS)} only; {MERGE_IT}"
            )
        outside = [m for m in held if m in PROJECTIONS and not _targets(lora, m)]
        if outside:
            out.append(
                f"it holds adapters for {join(outside)}, which {key}.target_modules="
                f"{show_value(lora.target_modules)} (less exclude_modules) does not target; add them"
            )
    return out


def _targets(lora: LoraConfig, projection: str) -> bool:
    """Whether `lora` targets `projection` in some layer; a pattern may (the load checks each tensor)."""

    def names(entry: str) -> bool:
        fused = MEGATRON_LINEARS.get(entry, ())
        return entry in (ALL_LINEAR, projection) or projection in fused

    if any(names(e) for e in lora.exclude_modules):
        return False
    return any(names(e) or is_pattern(e) for e in lora.target_modules)


# the largest adapter rank vLLM 0.32 serves (vllm.config.lora.MaxLoRARanks)
ENGINE_MAX_LORA_RANK = 512


def resolve_lora_sync(lora: LoraConfig) -> tuple[str, str]:
    """(how the engine gets the actor's LoRA policy, why): "adapter" or "merged"; `lora.sync=auto` takes
    adapter unless the engine cannot serve the adapter, and says why."""
    if lora.sync != "auto":
        return lora.sync, f"actor.lora.sync={lora.sync}"
    if lora.rank > ENGINE_MAX_LORA_RANK:
        return (
            "merged",
            f"vLLM serves adapters up to rank {ENGINE_MAX_LORA_RANK}, actor.lora.rank={lora.rank}",
        )
    return "adapter", "the engine serves the adapter (actor.lora.sync=auto)"
