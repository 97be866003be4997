"""Role checkpoints of a model with LoRA adapters: the adapters alone, and what they must match on load.

A LoRA role's checkpoint holds only its adapters (the `.lora.` entries of the model's sharded state
dict) and their optimizer state; the frozen base is the model path's and is not written. Its
megarl_checkpoint.json records the settings under "lora":

    {"rank", "alpha", "dropout", "target_modules", "exclude_modules", "init_A", "base_model_path"}

    lora_meta(cfg, base_model_path)        that entry
    settings(entry)                        a LoraConfig-like namespace of it (for targets and PEFT files)
    check_lora(meta, cfg, arch, role_dir)  CheckpointError unless the checkpoint and the model agree
    adapter_entries(sharded)               the adapter entries of a chunk's sharded_state_dict
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from megarl.checkpoint.format import CheckpointError
from megarl.models.from_hf import ModelArchitecture

LORA_KEY = "lora"
ADAPTER_MARK = ".lora."  # in every adapter's state-dict key: <linear>.lora.<projection>.lora_A|lora_B
SETTINGS = ("rank", "alpha", "dropout", "target_modules", "exclude_modules")  # must match to resume


def _entries(value: Any) -> list[str] | str:
    return value if isinstance(value, str) else list(value or [])


def lora_meta(cfg: Any, base_model_path: str | Path) -> dict[str, Any]:
    """The checkpoint's record of the LoRA settings `cfg` (a LoraConfig) and the base they adapt."""
    return {
        "rank": int(cfg.rank),
        "alpha": float(cfg.alpha),
        "dropout": float(cfg.dropout),
        "target_modules": _entries(cfg.target_modules),
        "exclude_modules": _entries(cfg.exclude_modules),
        "init_A": getattr(cfg, "init_A", "kaiming"),
        "base_model_path": str(base_model_path),
    }


def settings(entry: dict[str, Any]) -> SimpleNamespace:
    """A LoraConfig-like namespace of a checkpoint's "lora" entry."""
    return SimpleNamespace(**{k: v for k, v in entry.items() if k != "base_model_path"})


def adapter_entries(
    sharded: dict[str, Any], trained: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    """The entries of a chunk's sharded_state_dict a LoRA model trains: its adapters, and `trained` (the
    other trained parameters' names: a critic's value head); the rest is the frozen base."""
    return {k: v for k, v in sharded.items() if ADAPTER_MARK in k or k in trained}


def _describe(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k}={entry[k]!r}" for k in SETTINGS)


def check_lora(
    meta: dict[str, Any], cfg: Any, arch: ModelArchitecture | None, role_dir: str | Path, role: str = "actor"
) -> None:
    """CheckpointError, naming the settings and the fix, when a LoRA checkpoint meets a model without
    adapters or with other LoRA settings, or a full checkpoint meets a LoRA model (`cfg`: the model's
    LoraConfig, None without adapters). Targets compare by the adapters they give (`arch`'s layers)."""
    saved = meta.get(LORA_KEY)
    if saved is None and cfg is None:
        return
    if saved is None:
        raise CheckpointError(
            f"{role_dir} is a full checkpoint (no LoRA adapters) and this model trains adapters "
            f"(lora.rank={cfg.rank}): set {role}.lora.rank=0 to resume it as a full model; to train "
            f"adapters on its weights, export it (megarl convert mcore-to-hf) and set model.path to the export"
        )
    if cfg is None:
        raise CheckpointError(
            f"{role_dir} holds LoRA adapters only ({_describe(saved)}; base {saved['base_model_path']}) and "
            f"this model has none: set {role}.lora.rank={saved['rank']} with the same alpha, dropout, "
            "target_modules and exclude_modules to resume it, or make a full model of it with "
            "`megarl convert mcore-to-hf --merge-lora`"
        )
    ours = lora_meta(cfg, saved["base_model_path"])
    differ = [k for k in ("rank", "alpha", "dropout") if saved[k] != ours[k]]
    if arch is not None:
        from megarl.models.lora.targets import lora_tensors

        if {t.megatron for t in lora_tensors(arch, settings(saved))} != {
            t.megatron for t in lora_tensors(arch, cfg)
        }:
            differ += ["target_modules", "exclude_modules"]
    elif (saved["target_modules"], saved["exclude_modules"]) != (
        ours["target_modules"],
        ours["exclude_modules"],
    ):
        differ += ["target_modules", "exclude_modules"]
    if differ:
        raise CheckpointError(
            f"{role_dir} was saved with LoRA "
            + ", ".join(f"{k}={saved[k]!r}" for k in differ)
            + "; this model has "
            + ", ".join(f"{k}={ours[k]!r}" for k in differ)
            + f": set {', '.join(f'{role}.lora.{k}={saved[k]!r}' for k in differ)} to resume it"
        )
