"""Checks of each worker group's devices and parallel layout against the cluster and the model.

The layout rules themselves are `ParallelLayout.check`'s (distributed/layout.py); here they are applied
to each role's config keys. Model sizes (heads, layers, experts) come from the Hugging Face `config.json`
of each role's checkpoint.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass

from megarl.config.devices import show_devices
from megarl.config.errors import at_least, divisors, join, need_divides
from megarl.config.options import ModelType
from megarl.config.schema import MegarlConfig
from megarl.distributed.layout import LayoutKeys, ParallelLayout, ParallelSizes


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a Hugging Face model that constrain its parallel layout."""

    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    num_experts: int  # routed experts per MoE layer; 0 = dense model
    # the longest sequence (prompt + response) it takes: max_position_embeddings (× a linear or dynamic
    # RoPE scaling factor); None when config.json does not say
    max_position_embeddings: int | None = None
    model_type: str | None = None  # config.json's (llama, qwen2, ...); None when it does not say


def read_model_dims(model_path: str) -> ModelDims:
    """Read `<model_path>/config.json`; raises OSError, ValueError or KeyError when it is unusable."""
    with open(os.path.join(model_path, "config.json")) as f:
        hf = json.load(f)
    heads = int(hf["num_attention_heads"])
    experts = hf.get("num_local_experts") or hf.get("num_experts") or hf.get("n_routed_experts") or 0
    return ModelDims(
        num_attention_heads=heads,
        num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
        num_hidden_layers=int(hf["num_hidden_layers"]),
        vocab_size=int(hf["vocab_size"]),
        num_experts=int(experts),
        max_position_embeddings=_positions(hf),
        model_type=hf.get("model_type"),
    )


# RoPE scalings whose max_position_embeddings already counts the scaled context (as vLLM reads them)
_SCALED_ALREADY = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _positions(hf: dict) -> int | None:
    """The longest sequence a config.json's model takes: max_position_embeddings, times the RoPE
    scaling factor of the scalings that leave it unscaled (linear, dynamic), as vLLM counts it."""
    if not hf.get("max_position_embeddings"):
        return None
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    factor = rope.get("factor") if isinstance(rope, dict) and kind not in _SCALED_ALREADY else None
    return int(hf["max_position_embeddings"] * (factor or 1))


def load_dims(cfg: MegarlConfig, check_paths: bool, problems: list[str]) -> dict[str, ModelDims]:
    """Model sizes per role, read from each role's checkpoint; missing paths are reported here."""
    if not check_paths:
        return {}
    paths = {"actor": ("model.path", cfg.model.path)}
    if cfg.critic.enable:
        paths["critic"] = (
            ("critic.model_path", cfg.critic.model_path) if cfg.critic.model_path else paths["actor"]
        )
    # an hf-backend RM is any transformers classifier: no decoder dims to check
    if cfg.reward.enable and cfg.reward.model_path and cfg.reward.backend == "megatron":
        paths["reward"] = ("reward.model_path", cfg.reward.model_path)
    # a model megarl's conversion tables must build: a Megatron role's (the reference's is the actor's path);
    # an FSDP role runs any architecture transformers knows (megarl.fsdp.checks, before the workers start)
    megatron = {r: cfg.backend_of(r) == "megatron" for r in paths if r != "reward"} | {"reward": True}
    megatron["actor"] = megatron["actor"] or bool(cfg.ref.enable and cfg.backend_of("ref") == "megatron")
    dims: dict[str, ModelDims] = {}
    read: dict[tuple[str | None, bool], ModelDims | None] = {}
    for role, (key, path) in paths.items():
        if (path, megatron[role]) not in read:
            read[path, megatron[role]] = _read_dims(key, path, problems, megatron[role])
        if read[path, megatron[role]] is not None:
            dims[role] = read[path, megatron[role]]
    return dims


def _read_dims(key: str, path: str | None, problems: list[str], megatron: bool = True) -> ModelDims | None:
    if not path:
        problems.append(f"{key} is not set; set {key}=/path/to/hf_checkpoint (a directory with config.json)")
        return None
    if os.path.isfile(path):
        problems.append(
            f"{key}={path} is a file; point it at the Hugging Face checkpoint directory that holds "
            f"config.json + weights (e.g. {key}={os.path.dirname(path)})"
        )
        return None
    if not os.path.isdir(path):
        problems.append(
            f"{key}={path} does not exist; point it at a Hugging Face checkpoint directory (config.json + weights)"
        )
        return None
    try:
        dims = read_model_dims(path)
        model_type = dims.model_type
        if megatron and model_type is not None and model_type not in typing.get_args(ModelType):
            problems.append(
                f"{key}={path} is a {model_type!r} model (model_type in its config.json), which megarl does not "
                f"build; use a checkpoint of one of {', '.join(typing.get_args(ModelType))}"
            )
            return None
        return dims
    except FileNotFoundError:
        problems.append(f"{key}={path} has no config.json; point it at a Hugging Face checkpoint directory")
    except (OSError, ValueError, KeyError, TypeError) as e:
        problems.append(
            f"{key}={path}: config.json is unreadable ({type(e).__name__}: {e}); fix or re-export it"
        )
    return None


def check_worker_group(
    cfg: MegarlConfig, role: str, dims: ModelDims | None, problems: list[str]
) -> ParallelLayout | None:
    """Check one worker group's devices and layout; its ParallelLayout when both are valid. The devices'
    names and pools are `megarl.config.placement`'s to check; here only their number matters."""
    r, cluster = getattr(cfg, role), cfg.cluster_size()
    n_devices = getattr(r, "n_devices", None)  # the reference has devices but no n_devices
    devices_ok = n_devices is None or at_least(problems, f"{role}.n_devices", n_devices, 1, "or null for all")
    if devices_ok and n_devices is not None and n_devices > cluster:
        problems.append(
            f"{role}.n_devices={n_devices} exceeds the {cluster} devices of the cluster "
            "(trainer.nnodes·trainer.n_devices_per_node); lower it or add nodes"
        )
        devices_ok = False
    if n_devices not in (None, cluster) and cfg.trainer.launcher == "torchrun":
        problems.append(
            f"{role}.n_devices={n_devices} needs trainer.launcher=ray; under torchrun every role spans all "
            f"{cluster} devices, so set {role}.n_devices=null"
        )
    keys, parallel = LayoutKeys(cfg.parallel_key(role)), cfg.parallel_of(role)
    world, where = None, None
    if r.devices is not None:
        world = len(r.devices)
        count = f"{world} device" + ("s" if world != 1 else "")
        where = f"the {count} of the {role} ({role}.devices={show_devices(r.devices)})"
    elif devices_ok and cluster >= 1:
        t, world = cfg.trainer, cfg.world_size(role)
        if n_devices:
            source = f"{role}.n_devices"
        elif role == "actor" or cfg.actor.devices is None and cfg.actor.n_devices is None:
            source = f"trainer.nnodes·trainer.n_devices_per_node = {t.nnodes}·{t.n_devices_per_node}"
        else:
            source = "the actor's"
        where = f"the {world} devices of the {role} ({source})"
    layout_problems = ParallelLayout.check(parallel, world or None, keys, where)
    problems += layout_problems
    if dims is not None:
        check_layout_vs_model(keys, parallel, dims, problems)
    if layout_problems or not world:
        return None
    return cfg.layout(role)


def check_layout_vs_model(keys: LayoutKeys, p: ParallelSizes, dims: ModelDims, problems: list[str]) -> None:
    """Append a problem for each size of layout `p` (tp, pp, vpp, ep) that the model cannot be split by;
    sizes below 1 are left to ParallelLayout.check."""
    if min(p.tp, p.pp, p.ep) < 1 or (p.vpp is not None and p.vpp < 1):
        return
    heads = [
        ("num_attention_heads", dims.num_attention_heads),
        ("num_key_value_heads", dims.num_key_value_heads),
    ]
    need_divides(problems, keys.key("tp"), p.tp, heads)
    layers = dims.num_hidden_layers
    if need_divides(problems, keys.key("pp"), p.pp, [("num_hidden_layers", layers)]) and p.vpp and p.pp > 1:
        if layers % (p.pp * p.vpp):
            problems.append(
                f"{keys.setting('vpp', p.vpp)}: pp·vpp = {p.pp * p.vpp} does not divide num_hidden_layers={layers}; "
                f"use vpp in {join(divisors(layers // p.pp))}, or {keys.unset('vpp', None)}"
            )
    if p.ep > 1 and dims.num_experts == 0:
        problems.append(
            f"{keys.setting('ep', p.ep)} but the model is dense (no experts); set {keys.key('ep')}=1"
        )
    elif p.ep > 1:
        need_divides(problems, keys.key("ep"), p.ep, [("num_experts", dims.num_experts)])
