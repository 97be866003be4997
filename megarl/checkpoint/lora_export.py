"""LoRA adapters out of megarl: PEFT adapter directories and merged Hugging Face models.

    export_lora(chunks, arch, cfg, base, out_dir, merged_dir=None)   from a live model (collective):
        adapter_config.json + adapter_model.safetensors, loadable with
        `peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out_dir)`; with
        `merged_dir` also the base with the adapters folded in
    read_checkpoint_adapter(ckpt_dir, meta)                          an adapter-only role checkpoint's
    write_lora_export(adapter, meta, out_dir, merge, base)           adapters, in one process without
        megatron, as a PEFT adapter or merged (`megarl convert mcore-to-hf [--merge-lora] [--base DIR]`)
    write_merged_hf(base, adapter, cfg, out_dir)                     the merged model, one tensor at a time

The merged model is the base's files (its dtype, its shards' tensors) with W + (alpha / r)·B·A (computed in
float64) for every targeted projection.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megarl.checkpoint.dist_reader import Box, DistCheckpointReader
from megarl.checkpoint.format import CheckpointError
from megarl.checkpoint.lora_state import LORA_KEY, settings
from megarl.models.convert.safetensors_shards import (
    _DTYPES,
    DEFAULT_MAX_SHARD_SIZE,
    ShardWriter,
    TensorSpec,
    parse_size,
    plan_shards,
    write_index,
)
from megarl.models.from_hf import ModelArchitecture
from megarl.models.lora.targets import lora_tensors

_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


def read_checkpoint_adapter(ckpt_dir: str | Path, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """{PEFT name: full tensor} of an adapter-only checkpoint's dist-checkpoint (`meta`: its
    megarl_checkpoint.json), one layer read at a time. The adapters are stacked over layers like every
    layer parameter: key `decoder.layers.<suffix>`. Run it under safe_load.no_code_unpickling."""
    arch = ModelArchitecture.from_pretrained(Path(ckpt_dir) / "hf")
    cfg = settings(meta[LORA_KEY])
    reader = DistCheckpointReader(Path(ckpt_dir) / "model")
    expected = lora_tensors(arch, cfg)
    prefix = "decoder.layers."
    boxes: dict[int, list[Box]] = {}
    for t in expected:
        key = prefix + t.megatron.split(".", 3)[3]
        if key not in reader.tensors:
            raise CheckpointError(
                f"{ckpt_dir}/model has no {key}, which its LoRA settings target; the checkpoint is damaged "
                "or its megarl_checkpoint.json is not its own"
            )
        _, dtype = reader.tensors[key]
        boxes.setdefault(t.layer, []).append(Box(t.peft, key, (t.layer, 0, 0), (1, *t.shape), dtype, True))
    out: dict[str, torch.Tensor] = {}
    for layer_boxes in boxes.values():
        out.update(reader.read(layer_boxes))
    return {t.peft: out[t.peft] for t in expected}


def _base_specs(base: Path) -> tuple[Any, list[TensorSpec]]:
    from megarl.models.convert.hf_io import HFCheckpointReader

    reader = HFCheckpointReader(base)
    specs = []
    for name in reader.names():
        shape, dtype = reader.describe(name)
        specs.append(TensorSpec(name, shape, _TORCH_DTYPES[dtype]))
    return reader, specs


def write_merged_hf(
    base: str | Path,
    adapter: dict[str, torch.Tensor],
    cfg: Any,
    out_dir: str | Path,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> dict[str, Any]:
    """The HF model at `base` with `adapter` ({PEFT name: full tensor}, settings `cfg`) merged into it,
    written to `out_dir` (staged beside it, renamed into place) one tensor in memory at a time."""
    from megarl.checkpoint.format import partial_dir
    from megarl.models.convert.hf_io import copy_hf_metadata
    from megarl.models.lora.merge import merge_into_hf

    base, out_dir = Path(base), Path(out_dir)
    reader, specs = _base_specs(base)
    merged_modules = {n.removesuffix(".weight") for n in reader.names() if n.endswith(".weight")}
    unknown = sorted(
        n
        for n in adapter
        if ".lora_A." in n and n[len("base_model.model.") : n.index(".lora_A.")] not in merged_modules
    )
    if unknown:
        raise CheckpointError(
            f"the base model {base} has no weight for the adapter's {unknown[0]}; pass its own base"
        )
    plan = plan_shards([specs], parse_size(max_shard_size))
    staging = partial_dir(out_dir)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        writer = ShardWriter(staging, plan)
        for name, tensor in merge_into_hf(((n, reader.get(n)) for n in reader.names()), adapter, cfg):
            writer.write(name, tensor)
        writer.close()
        write_index(staging, plan)
        copy_hf_metadata(base, staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"merged": str(out_dir), "base": str(base), "bytes": plan.index()["metadata"]["total_size"]}


def _check_base(base: Path, meta: dict[str, Any]) -> None:
    from megarl.checkpoint.role import fingerprint

    if not (base / "config.json").is_file() or not any(base.glob("*.safetensors")):
        raise CheckpointError(
            f"the adapters' base model {base} is not there (no config.json and safetensors); pass --base "
            "DIR, the HF model they were trained on"
        )
    saved, ours = meta.get("architecture") or {}, fingerprint(ModelArchitecture.from_pretrained(base))
    differ = [k for k in ours if k in saved and saved[k] != ours[k]]
    if differ:
        raise CheckpointError(
            f"--base {base} has {', '.join(f'{k} {ours[k]}' for k in differ)}, the adapters' model had "
            f"{', '.join(f'{k} {saved[k]}' for k in differ)}; pass --base the model they were trained on"
        )


def write_lora_export(
    adapter: dict[str, torch.Tensor],
    meta: dict[str, Any],
    out_dir: Path,
    merge: bool = False,
    base: str | Path | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> dict[str, Any]:
    """An adapter-only role checkpoint's adapter (read_checkpoint_adapter; `meta` its
    megarl_checkpoint.json) as a PEFT adapter directory at `out_dir`, or with `merge` as the merged HF
    model (base: `base`, else the base path the checkpoint recorded)."""
    from megarl.models.lora.peft_io import write_peft

    entry = meta[LORA_KEY]
    cfg = settings(entry)
    base_dir = Path(base or entry["base_model_path"])
    if merge:
        _check_base(base_dir, meta)
        result = write_merged_hf(base_dir, adapter, cfg, out_dir, max_shard_size)
    else:
        write_peft(out_dir, adapter, cfg, str(base_dir))
        result = {"peft": str(out_dir), "base": str(base_dir)}
    return {
        **result,
        "adapter_tensors": len(adapter),
        "adapter_bytes": sum(t.numel() * t.element_size() for t in adapter.values()),
    }


def export_lora(
    chunks: list[torch.nn.Module],
    arch: ModelArchitecture,
    cfg: Any,
    base_model_path: str | Path,
    out_dir: str | Path,
    merged_dir: str | Path | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Collective over the model's world: gather the adapters (TP and PP) and write them from rank 0 as a
    PEFT adapter at `out_dir`; with `merged_dir` also the merged HF model (base: `base_model_path`, whose
    weights the frozen base holds). Every rank raises if rank 0's writing failed. Returns `out_dir`."""
    from megarl.models.lora.peft_io import gather_full_adapter, write_peft

    adapter = gather_full_adapter(chunks, arch, cfg)
    failure = None
    if dist.get_rank() == 0:
        try:
            if merged_dir is not None:  # first: it replaces merged_dir, which may hold out_dir
                write_merged_hf(base_model_path, adapter, cfg, merged_dir, max_shard_size)
            write_peft(out_dir, adapter, cfg, str(base_model_path))
        except (OSError, ValueError, CheckpointError) as e:
            failure = f"exporting the adapters to {out_dir} failed: {type(e).__name__}: {e}"
    failed = [failure]
    dist.broadcast_object_list(failed, src=0)
    if failed[0]:
        raise OSError(failed[0])
    return Path(out_dir)
