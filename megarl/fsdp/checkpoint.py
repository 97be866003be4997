"""An FSDP role's checkpoint: the Megatron roles' directory (megarl.checkpoint.role), written with
torch.distributed.checkpoint (DCP) from FSDP2's sharded state dicts, so any world size can load it.

    <role_dir>/
      megarl_checkpoint.json   backend "fsdp", dtype, source, model_class, world_size, has_optimizer,
                               architecture (fingerprint of the HF config)
      hf/                      the live model's config.json + the source's tokenizer/generation files
      model/                   DCP of get_model_state_dict: the transformers parameter names at full shape
      optimizer/               DCP of get_optimizer_state_dict: torch's moments and steps by parameter name
      scheduler.json           megatron's OptimizerParamScheduler.state_dict()
      rng/rank_<r>.json|.safetensors   each rank's RNG states and the worker's extra counters
      manifest.json            every file's size and CRC-32, written last: its presence means complete

Loading at the saved world size continues bit-exactly (parameters, moments, steps, schedule, RNG); at
another the shards are re-cut by DCP and the RNG keeps its fresh seeding. `export_fsdp_hf` writes the
live weights in the model's own `save_pretrained` layout. All three are collective over the role's world.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megarl.checkpoint import manifest as mf
from megarl.checkpoint import rng_state
from megarl.checkpoint.format import FORMAT_VERSION, CheckpointError, begin_write, finish_write, read_meta
from megarl.checkpoint.hf_export import tied_names
from megarl.checkpoint.paths import META_FILE
from megarl.checkpoint.role_common import (
    OPTIMIZER_DIR,
    all_or_none,
    check_hf_fingerprint,
    hf_fingerprint,
    load_errors,
    load_rank_state,
    load_schedule,
    rank_bytes,
    save_errors,
    save_failure,
    write_schedule,
    wrong_backend,
)
from megarl.checkpoint.safe_load import no_code_unpickling
from megarl.controller import faults
from megarl.fsdp.optimizer import FSDPOptimizer

BACKEND = "fsdp"


def model_class(model: torch.nn.Module) -> str:
    """The transformers class of `model`, under FSDP2's wrapper class (FSDP<Class>)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule)).__name__


def check_model(meta: dict[str, Any], model: torch.nn.Module, role_dir: Path, model_path: str) -> None:
    """CheckpointError when `role_dir` was saved from another model: another architecture (the differing
    config entries) or another head (the transformers class)."""
    check_hf_fingerprint(meta, model.config, role_dir, model_path)
    saved, ours = meta.get("model_class"), model_class(model)
    if saved not in (None, ours):
        raise CheckpointError(
            f"{role_dir} holds a {saved}; the role builds a {ours} from {model_path}; resume from a "
            "checkpoint of this role"
        )


def _layout(world: int) -> dict[str, Any]:
    """What makes RNG state rank-specific under FSDP: every rank is a data-parallel rank."""
    return {"backend": BACKEND, "world_size": world, "dp": world}


def _model_state(model: torch.nn.Module) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model)


def _optimizer_state(model: torch.nn.Module, optimizer: FSDPOptimizer) -> dict[str, Any]:
    """torch's optimizer state keyed by parameter name (an optimizer that never stepped gets its state
    created by an lr-0 step first, which changes no parameter)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer.optimizer)


def save_fsdp_state(
    model: torch.nn.Module,
    optimizer: FSDPOptimizer | None,
    role_dir: str | Path,
    meta: dict[str, Any],
    model_path: str | Path,
    extra_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Collective: write the FSDP role's checkpoint into `role_dir` (created; the caller stages and
    renames). `meta` holds dtype, source and role; `extra_state` the worker's counters (JSON values or
    tensors, per rank); `model_path` the source whose tokenizer files go into hf/. An optimizer that has
    not stepped yet has no state: has_optimizer is then false. Returns this rank's
    {rank, seconds, bytes_written}."""
    import torch.distributed.checkpoint as dcp

    from megarl.models.convert.hf_io import copy_hf_metadata

    start = time.perf_counter()
    role_dir = Path(role_dir)
    rank, world = dist.get_rank(), dist.get_world_size()
    if (role_dir / mf.MANIFEST_FILE).exists():  # every rank sees it: they stop together
        raise CheckpointError(f"{role_dir} already holds a complete checkpoint; save into a new directory")
    has_optimizer = optimizer is not None and len(optimizer.optimizer.state) > 0
    agreed = torch.tensor([int(has_optimizer)], dtype=torch.int64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # the optimizer save is collective: all or none
    has_optimizer = bool(agreed.item())
    full_meta = {
        "format_version": FORMAT_VERSION,
        **meta,
        "backend": BACKEND,
        "model_class": model_class(model),
        "layout": _layout(world),
        "world_size": world,
        "has_optimizer": has_optimizer,
        "architecture": hf_fingerprint(model.config),
    }
    error = None
    if rank == 0:
        try:
            for sub in ("model", OPTIMIZER_DIR, rng_state.RNG_DIR):
                (role_dir / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            error = str(save_failure(e, role_dir, rank))
    all_or_none(error)
    with save_errors(role_dir, rank):
        dcp.save(_model_state(model), checkpoint_id=str(role_dir / "model"))
    faults.point(meta.get("role", "?"), "save_checkpoint:model_written", rank)  # MEGARL_FAULT tests
    if has_optimizer:
        assert optimizer is not None
        state = _optimizer_state(model, optimizer)
        with save_errors(role_dir, rank):
            dcp.save(state, checkpoint_id=str(role_dir / OPTIMIZER_DIR))
    try:
        rng_state.write_rank_state(role_dir, rank, full_meta["layout"], extra_state)
        if rank == 0:
            if optimizer is not None:
                write_schedule(role_dir, optimizer.scheduler)
            copy_hf_metadata(model_path, role_dir / "hf")
            model.config.to_json_file(role_dir / "hf" / "config.json")  # with the head a critic adds
            _name_the_class(role_dir / "hf" / "config.json", full_meta["model_class"])
            (role_dir / META_FILE).write_text(_json(full_meta))
    except OSError as e:
        error = str(save_failure(e, role_dir, rank))
    except (TypeError, ValueError) as e:
        error = f"writing {role_dir} failed on rank {rank}: {type(e).__name__}: {e}"
    all_or_none(error)
    if rank == 0:
        mf.write_manifest(role_dir)
    dist.barrier()
    written = rank_bytes(mf.read_manifest(role_dir), rank)
    return {"rank": rank, "seconds": time.perf_counter() - start, "bytes_written": written}


def _json(value: dict[str, Any]) -> str:
    import json

    return json.dumps(value, indent=2)


def _stored_shapes(directory: Path) -> dict[str, tuple[int, ...] | None]:
    """{key: global shape (None for a non-tensor entry)} of the DCP at `directory`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    with no_code_unpickling(), load_errors(directory.parent, directory.name):
        metadata = FileSystemReader(str(directory)).read_metadata()
    return {
        key: tuple(md.size) if isinstance(md, TensorStorageMetadata) else None
        for key, md in metadata.state_dict_metadata.items()
    }


def _check_matches(state: dict[str, Any], directory: Path, what: str, model_path: str) -> None:
    """CheckpointError, before any tensor is read, when the DCP at `directory` lacks an entry `state`
    needs or stores it at another shape (a checkpoint of another model or optimizer)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    stored = _stored_shapes(directory)
    flat, _ = flatten_state_dict(state)
    missing = [k for k in flat if k not in stored]
    reshaped = [
        f"{k} {list(stored[k] or [])} (the model has {list(v.shape)})"
        for k, v in flat.items()
        if k in stored
        and isinstance(v, torch.Tensor)
        and stored[k] is not None
        and stored[k] != tuple(v.shape)
    ]
    if missing or reshaped:
        parts = []
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            parts.append(f"it lacks {', '.join(missing[:5])}{more}")
        if reshaped:
            parts.append(f"it stores {'; '.join(reshaped[:5])}")
        raise CheckpointError(
            f"the {what} of {directory.parent} does not fit the role's model ({model_path}): "
            f"{'; '.join(parts)}; resume from a checkpoint of this model"
        )


def load_fsdp_state(
    model: torch.nn.Module,
    optimizer: FSDPOptimizer | None,
    role_dir: str | Path,
    load_optimizer: bool = True,
    load_rng: bool = True,
    *,
    model_path: str | None = None,
) -> dict[str, Any]:
    """Collective: verify `role_dir` (manifest sizes and checksums, the model's fingerprint and class,
    every stored entry's shape) and fill the model, the optimizer and the scheduler from it; restore the
    RNG when the world size is the saved one. Raises CheckpointError, on every rank, before changing
    anything when the checkpoint is unusable (or Megatron's). Returns a report; "extra_state" holds the
    worker's saved counters."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    start = time.perf_counter()
    role_dir = Path(role_dir)
    meta = read_meta(role_dir)
    if (refused := wrong_backend(role_dir, meta, BACKEND)) is not None:
        raise refused
    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = mf.read_manifest(role_dir)
    mf.verify_collective(role_dir, manifest)
    source = model_path or "?"
    check_model(meta, model, role_dir, source)
    model_state = _model_state(model)
    _check_matches(model_state, role_dir / "model", "model", source)
    use_optimizer = optimizer is not None and load_optimizer and bool(meta.get("has_optimizer"))
    report: dict[str, Any] = {
        "from": str(role_dir),
        "saved_world_size": meta.get("world_size"),
        "model": True,
    }
    with torch.no_grad(), no_code_unpickling():
        optimizer_state = None
        if use_optimizer:
            assert optimizer is not None
            optimizer_state = _optimizer_state(model, optimizer)  # creates the state: lr-0, no change
            _check_matches(optimizer_state, role_dir / OPTIMIZER_DIR, "optimizer state", source)
        with load_errors(role_dir, "model"):
            dcp.load(model_state, checkpoint_id=str(role_dir / "model"))
            set_model_state_dict(model, model_state)
        if optimizer is None or not load_optimizer:
            report["optimizer"] = "not loaded"
        elif optimizer_state is None:
            report["optimizer"] = "not saved (no optimizer step before the save)"
        else:
            assert optimizer is not None
            with load_errors(role_dir, "optimizer state"):
                dcp.load(optimizer_state, checkpoint_id=str(role_dir / OPTIMIZER_DIR))
                set_optimizer_state_dict(model, optimizer.optimizer, optimizer_state)
            report["optimizer"] = "loaded"
    if optimizer is not None and load_schedule(role_dir, optimizer.scheduler):
        report["num_updates"] = optimizer.num_updates
    same_layout = meta.get("layout") == _layout(world)
    report["extra_state"], report["rng"] = load_rank_state(role_dir, rank, same_layout, load_rng)
    report["verified_files"] = len(manifest["files"])
    report["seconds"] = time.perf_counter() - start
    return report


def export_fsdp_hf(model: torch.nn.Module, model_path: str | Path, out_dir: str | Path) -> Path:
    """Collective: save the live weights of `model` as an HF checkpoint at `out_dir` in the model's own
    `save_pretrained` layout, with the source's tokenizer files; returns the path. The full state dict is
    gathered to rank 0's CPU memory, which writes it; the output is staged in `<out_dir>.partial` and
    renamed into place only once complete."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from megarl.models.convert.hf_io import copy_hf_metadata

    out_dir = Path(out_dir)
    staging = begin_write(out_dir, overwrite=True)  # collective
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # a tied lm_head is the embedding, which the model's own checkpoint stores once (vLLM refuses an
    # lm_head tensor a tied model lacks)
    tied = set(tied_names(model))
    full = {name: tensor for name, tensor in full.items() if name not in tied}
    failure = None
    if dist.get_rank() == 0:
        try:
            (staging / "model").rmdir()  # begin_write's layout is the dist-checkpoint's
            copy_hf_metadata(model_path, staging)  # the tokenizer; save_pretrained rewrites the configs
            model.save_pretrained(staging, state_dict=full)
            _name_the_class(staging / "config.json", model_class(model))
        except Exception as e:  # any: the other ranks wait for this rank's word in the gather below
            failure = f"writing the HF checkpoint {out_dir} failed on rank 0: {type(e).__name__}: {e}"
    del full
    failures: list = [None] * dist.get_world_size()
    dist.all_gather_object(failures, failure)  # every rank fails together instead of hanging in a barrier
    if any(failures):
        if dist.get_rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)  # a failed export leaves nothing half-written
        raise OSError("; ".join(f for f in failures if f))
    finish_write(staging, out_dir)  # collective
    return out_dir


def _name_the_class(config_file: Path, name: str) -> None:
    """The model's own class as the config's architecture: save_pretrained records the wrapper's
    (FSDP<Class>), and a critic's config is still its source language model's."""
    import json

    config = json.loads(config_file.read_text())
    config["architectures"] = [name]
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
