"""PEFT's adapter files in and out of a megatron model's adapters.

    read_peft_adapter(dir)                    (adapter_config.json as a dict, {PEFT name: tensor})
    load_peft_adapter(chunks, arch, cfg, dir) copy each rank's shard of a PEFT adapter into its adapters
    gather_full_adapter(chunks, arch, cfg)    {PEFT name: full tensor} on every rank (collective)
    write_peft(out_dir, tensors, cfg, base)   adapter_config.json + adapter_model.safetensors

A PEFT adapter file holds `base_model.model.<HF module>.lora_{A,B}.weight` tensors of full shape; the
names, shapes and TP layouts are `megarl.models.lora.targets`'.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from megarl.errors import MegarlError
from megarl.models.convert.sharding import shard, unshard
from megarl.models.from_hf import ModelArchitecture
from megarl.models.lora.apply import lora_params
from megarl.models.lora.targets import PROJECTIONS, LoraTensor, lora_tensors, megatron_to_peft

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


class AdapterError(MegarlError):
    """A PEFT adapter that does not fit the model or the LoRA settings."""


def read_peft_adapter(adapter_dir: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """adapter_config.json and the tensors of a PEFT adapter directory."""
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (adapter_dir / f).is_file()]
    if missing:
        raise AdapterError(
            f"{adapter_dir} is not a PEFT adapter: it has no {', '.join(missing)} "
            "(save one with PeftModel.save_pretrained, or megarl convert ... --peft)"
        )
    config = json.loads((adapter_dir / CONFIG_FILE).read_text())
    return config, load_file(str(adapter_dir / WEIGHTS_FILE))


def check_adapter(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], expected: list[LoraTensor], cfg: Any, where: str
) -> None:
    """Raise AdapterError naming every mismatch between a PEFT adapter and the adapters `cfg` builds."""
    problems = []
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type is {config.get('peft_type')!r}, not LORA")
    if config.get("r") != cfg.rank:
        problems.append(f"its r={config.get('r')} but lora.rank={cfg.rank}: set lora.rank={config.get('r')}")
    if float(config.get("lora_alpha", cfg.alpha)) != float(cfg.alpha):
        problems.append(f"its lora_alpha={config.get('lora_alpha')} but lora.alpha={cfg.alpha}")
    if config.get("use_rslora") or config.get("use_dora"):
        problems.append("rsLoRA / DoRA adapters are not supported")
    names = {t.peft for t in expected}
    extra = sorted(set(tensors) - names)
    absent = sorted(names - set(tensors))
    if extra:
        problems.append(
            f"{len(extra)} tensors for modules lora.target_modules/exclude_modules leave out, e.g. {extra[0]}"
        )
    if absent:
        problems.append(f"{len(absent)} targeted tensors missing, e.g. {absent[0]}")
    for t in expected:
        if t.peft in tensors and tuple(tensors[t.peft].shape) != t.shape:
            problems.append(f"{t.peft} has shape {tuple(tensors[t.peft].shape)}, the model needs {t.shape}")
            break
    if problems:
        raise AdapterError(f"the adapter at {where} does not fit this model: " + "; ".join(problems))


@torch.no_grad()
def load_peft_adapter(
    chunks: list[torch.nn.Module], arch: ModelArchitecture, cfg: Any, adapter_dir: str | Path
) -> int:
    """Copy this rank's shard of every adapter tensor from a PEFT adapter (checked against `cfg` and the
    model first); returns the number of tensors loaded."""
    from megatron.core import parallel_state

    config, tensors = read_peft_adapter(adapter_dir)
    check_adapter(config, tensors, lora_tensors(arch, cfg), cfg, str(adapter_dir))
    tp, tp_rank = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_rank(),
    )
    params = lora_params(chunks)
    for name, param in params.items():
        t = megatron_to_peft(name, arch, cfg.rank)
        param.copy_(shard(t.kind, tensors[t.peft].to(param.dtype), tp_rank, tp))
    return len(params)


def gather_full_adapter(
    chunks: list[torch.nn.Module], arch: ModelArchitecture, cfg: Any, grads: bool = False
) -> dict[str, torch.Tensor]:
    """Every adapter tensor (with `grads`: its finished gradient, megatron DDP's main_grad), full
    (TP-gathered) and from every PP stage, as CPU tensors by PEFT name, on every rank (collective over
    the world)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    tp_group = parallel_state.get_tensor_model_parallel_group()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    mine = {}
    for name, param in lora_params(chunks).items():
        t = megatron_to_peft(name, arch, cfg.rank)
        local = (getattr(param, "main_grad", param.grad) if grads else param).detach().contiguous()
        if tp > 1 and t.kind.tp_sharded:
            pieces = [torch.empty_like(local) for _ in range(tp)]
            dist.all_gather(pieces, local, group=tp_group)
            local = unshard(t.kind, pieces)
        mine[t.peft] = local.cpu()
    stages: list[Any] = [None] * parallel_state.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(stages, mine, group=parallel_state.get_pipeline_model_parallel_group())
    full = {k: v for stage in stages for k, v in stage.items()}
    return {t.peft: full[t.peft] for t in lora_tensors(arch, cfg)}  # one global order


def peft_config(tensors: dict[str, torch.Tensor], cfg: Any, base_model: str) -> dict[str, Any]:
    """adapter_config.json for these tensors: target_modules lists the projections, or, where layers
    differ, a regex over the exact module names (PEFT full-matches a string)."""
    modules = sorted(
        {name[len("base_model.model.") : -len(".lora_A.weight")] for name in tensors if ".lora_A." in name}
    )
    projections = sorted({m.rsplit(".", 1)[1] for m in modules})
    layers = {m.split(".")[2] for m in modules}
    uniform = len(modules) == len(layers) * len(projections)
    targets: list[str] | str = (
        projections if uniform else "^(" + "|".join(m.replace(".", r"\.") for m in modules) + ")$"
    )
    assert all(p in PROJECTIONS for p in projections)
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
    }


def write_peft(out_dir: str | Path, tensors: dict[str, torch.Tensor], cfg: Any, base_model: str) -> Path:
    """A PEFT adapter directory (written beside and renamed into place: never half a directory)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"}
    )
    (tmp / CONFIG_FILE).write_text(json.dumps(peft_config(tensors, cfg, base_model), indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
