"""A trained role's full checkpoint: weights, optimizer, LR schedule and RNG, resumable at any layout.

    <role_dir>/
      megarl_checkpoint.json   format, dtype, padded vocabulary, saved layout, source, architecture
                               fingerprint, world_size, has_optimizer
      hf/                      config.json + tokenizer of the source model
      model/                   dist-checkpoint of the weights (what `megarl convert mcore-to-hf` reads);
                               of a LoRA model its adapters only, the settings under "lora" in the meta
                               (megarl.checkpoint.lora_state: the frozen base is the model path's)
      optimizer/               dist-checkpoint of megatron's optimizer state (distributed optimizer:
                               fully_reshardable), loadable at any TP/PP/DP
      scheduler.json           OptimizerParamScheduler.state_dict()
      rng/rank_<r>.json|.safetensors   each rank's RNG states and the worker's extra counters
      manifest.json            every file's size and CRC-32, written last: its presence means complete

Loading at the saved layout continues bit-exactly (parameters, Adam moments and steps, schedule, RNG);
at another layout the model and optimizer state are resharded and the RNG keeps its fresh seeding.
Both functions are collective over the role's world.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megarl.checkpoint import manifest as mf
from megarl.checkpoint import rng_state
from megarl.checkpoint.format import (
    CheckpointError,
    _sharded_state,
    load_model,
    padded_vocab_for,
    read_meta,
    save_model,
)
from megarl.checkpoint.lora_state import LORA_KEY, check_lora, lora_meta
from megarl.checkpoint.optimizer_chain import load_across_chains, same_chain
from megarl.checkpoint.role_common import (
    OPTIMIZER_DIR,
    all_or_none,
    load_errors,
    load_rank_state,
    load_schedule,
    rank_bytes,
    refuse_other_model,
    save_errors,
    save_failure,
    write_schedule,
    wrong_backend,
)
from megarl.checkpoint.safe_load import no_code_unpickling
from megarl.controller import faults
from megarl.distributed.layout import ParallelLayout
from megarl.models.from_hf import ModelArchitecture

_log = logging.getLogger(__name__)

# fully_reshardable: the distributed optimizer's state in model space, so any TP/PP/DP can load it.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}


def fingerprint(arch: ModelArchitecture) -> dict[str, Any]:
    """What must match between a checkpoint and the model it is loaded into (HF config names)."""
    return {
        "family": arch.family,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "intermediate_size": arch.ffn_hidden_size,
        "vocab_size": arch.vocab_size,
        "head": arch.head,
        "tie_word_embeddings": arch.tie_embeddings,
    }


def check_fingerprint(
    meta: dict[str, Any], arch: ModelArchitecture, role_dir: str | Path, model: str
) -> None:
    """CheckpointError naming every differing field when `role_dir` was saved from another model."""
    saved = meta.get("architecture")
    if saved is None:
        return  # a weights-only checkpoint from `convert hf-to-mcore`: the shapes are checked on load
    refuse_other_model(saved, fingerprint(arch), role_dir, model)


def _modules(chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    return [getattr(c, "module", c) for c in chunks]  # DDP-wrapped or not: the same parameter keys


def _torch_optimizers(train_optimizer) -> list[torch.optim.Optimizer]:
    opt = train_optimizer.optimizer
    return [o.optimizer for o in getattr(opt, "chained_optimizers", [opt]) if o.optimizer is not None]


def _has_state(train_optimizer) -> bool:
    return all(
        len(inner.state.get(p, {})) > 0
        for inner in _torch_optimizers(train_optimizer)
        for group in inner.param_groups
        for p in group["params"]
    )


@torch.no_grad()
def _init_adam_state(train_optimizer) -> None:
    """torch AdamW creates its state (moments and `step`) at its first step, and megatron's load needs
    it in place: one step with zero gradients and lr 0 leaves every parameter unchanged."""
    if _has_state(train_optimizer):
        return
    for inner in _torch_optimizers(train_optimizer):
        lrs = [g["lr"] for g in inner.param_groups]
        for group in inner.param_groups:
            group["lr"] = 0.0
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        inner.step()
        for group, lr in zip(inner.param_groups, lrs):
            group["lr"] = lr
            for p in group["params"]:
                p.grad = None


def _unshare_steps(train_optimizer) -> None:
    """Megatron's distributed optimizer loads one `step` tensor into every parameter's state; torch's
    foreach AdamW would then add 1 per parameter per update. Each parameter gets its own copy."""
    for inner in _torch_optimizers(train_optimizer):
        for state in inner.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()


@contextlib.contextmanager
def _states_without_step(train_optimizer) -> Iterator[None]:
    """Megatron 0.16.1's distributed optimizer copies the checkpoint into every key of a parameter's
    torch state, `step` included, which the fully_reshardable format does not hold (KeyError 'step'):
    while loading, each parameter's state is handed over without its `step` (set from param_groups)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    patched = [
        o
        for o in getattr(train_optimizer.optimizer, "chained_optimizers", [])
        if isinstance(o, DistributedOptimizer)
    ]

    def without_step(opt, original):
        def set_states(model_param, tensors):
            group_index, group_order = opt.model_param_group_index_map[model_param]
            state = opt.optimizer.state[opt.optimizer.param_groups[group_index]["params"][group_order]]
            step = state.pop("step", None)
            try:
                original(model_param, tensors)
            finally:
                if step is not None:
                    state["step"] = step

        return set_states

    for opt in patched:
        opt._set_main_param_and_optimizer_states = without_step(opt, opt._set_main_param_and_optimizer_states)
    try:
        yield
    finally:
        for opt in patched:
            del opt._set_main_param_and_optimizer_states  # the class's method again


def _check_lora_given(chunks: list[torch.nn.Module], lora: Any) -> None:
    from megarl.models.lora.apply import has_lora

    if has_lora(chunks) != (lora is not None):
        raise ValueError(
            "pass lora= the LoraConfig the chunks' adapters were made with"
            if lora is None
            else "lora= is given but the chunks have no adapters (apply_lora first)"
        )


def _dp_parallel_save():
    """Megatron's fully parallel save: the data-parallel replicas split the writing of replicated
    tensors (by default the first replica writes them all)."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    return FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(), ps.get_data_parallel_group(with_context_parallel=True)
    )


def save_train_state(
    chunks: list[torch.nn.Module],
    train_optimizer,
    role_dir: str | Path,
    meta: dict[str, Any],
    hf_dir: str | Path,
    extra_state: dict[str, Any] | None = None,
    *,
    arch: ModelArchitecture | None = None,
    lora: Any = None,
) -> dict[str, Any]:
    """Collective: write the role checkpoint into `role_dir` (created; the caller stages and renames).
    `meta` holds dtype, padded_vocab_size and source; `extra_state` the worker's counters (JSON values
    or tensors, per rank). An optimizer that has not stepped yet has no state: has_optimizer is then
    false. `lora`: the LoraConfig of chunks with adapters: only the adapters are written, `hf_dir` is
    recorded as their base. Returns this rank's {rank, seconds, bytes_written}."""
    from megatron.core import dist_checkpointing

    start = time.perf_counter()
    role_dir = Path(role_dir)
    layout = ParallelLayout.active()
    rank, world = dist.get_rank(), dist.get_world_size()
    if (role_dir / mf.MANIFEST_FILE).exists():  # every rank sees it: they stop together
        raise CheckpointError(f"{role_dir} already holds a complete checkpoint; save into a new directory")
    has_optimizer = train_optimizer is not None and _has_state(train_optimizer)
    agreed = torch.tensor([int(has_optimizer)], dtype=torch.int64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # the optimizer save is collective: all or none
    has_optimizer = bool(agreed.item())
    full_meta = {
        **meta,
        "saved_layout": layout.describe(),
        "layout": rng_state.layout_of(layout),
        "world_size": world,
        "has_optimizer": has_optimizer,
    }
    if arch is not None:
        full_meta["architecture"] = fingerprint(arch)
    _check_lora_given(chunks, lora)
    if lora is not None:
        full_meta[LORA_KEY] = lora_meta(lora, hf_dir)
    if rank == 0:
        for sub in ("model", OPTIMIZER_DIR, rng_state.RNG_DIR):
            (role_dir / sub).mkdir(parents=True, exist_ok=True)
    dist.barrier()
    modules = _modules(chunks)
    with save_errors(role_dir, rank):
        save_model(modules, role_dir, full_meta, hf_dir, _dp_parallel_save(), adapters_only=lora is not None)
    faults.point(meta.get("role", "?"), "save_checkpoint:model_written", rank)  # MEGARL_FAULT tests
    if has_optimizer:
        opt_state = train_optimizer.optimizer.sharded_state_dict(
            _sharded_state(modules), is_loading=False, metadata=OPTIMIZER_METADATA
        )
        with save_errors(role_dir, rank):
            dist_checkpointing.save(opt_state, str(role_dir / OPTIMIZER_DIR), _dp_parallel_save())
    error = None
    try:
        rng_state.write_rank_state(role_dir, rank, full_meta["layout"], extra_state)
        if rank == 0 and train_optimizer is not None:
            write_schedule(role_dir, train_optimizer.scheduler)
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


def load_train_state(
    chunks: list[torch.nn.Module],
    train_optimizer,
    role_dir: str | Path,
    load_optimizer: bool = True,
    load_rng: bool = True,
    *,
    arch: ModelArchitecture | None = None,
    model_path: str | None = None,
    lora: Any = None,
) -> dict[str, Any]:
    """Collective: verify `role_dir` (manifest sizes and checksums, architecture against `arch`, padded
    vocabulary, LoRA settings against `lora`: the chunks' LoraConfig, None without adapters) and fill the
    chunks (of a LoRA model: its adapters), the optimizer and the scheduler from it; restore the RNG when
    the layout is the saved one. Raises CheckpointError, on every rank, before changing anything when the
    checkpoint is unusable. Returns a report; "extra_state" holds the worker's saved counters."""
    from megatron.core import dist_checkpointing

    start = time.perf_counter()
    role_dir = Path(role_dir)
    meta = read_meta(role_dir)
    if (refused := wrong_backend(role_dir, meta, "megatron")) is not None:
        raise refused
    layout = ParallelLayout.active()
    rank = dist.get_rank()
    manifest = mf.read_manifest(role_dir)
    mf.verify_collective(role_dir, manifest)
    if arch is not None:
        check_fingerprint(meta, arch, role_dir, model_path or "?")
    _check_lora_given(chunks, lora)
    check_lora(meta, lora, arch, role_dir, meta.get("role", "actor"))
    if lora is not None and model_path and meta[LORA_KEY]["base_model_path"] != str(model_path):
        _log.warning(
            "%s: its adapters were trained on %s; they are loaded onto model.path %s (same architecture)",
            role_dir,
            meta[LORA_KEY]["base_model_path"],
            model_path,
        )
    modules = _modules(chunks)
    padded = padded_vocab_for(meta, layout)
    built = getattr(modules[0], "vocab_size", padded)
    if built != padded:
        raise CheckpointError(
            f"{role_dir} has a padded vocabulary of {padded}; this model was built with {built} at "
            f"tp={layout.tp}; set model.make_vocab_size_divisible_by so that both pad alike"
        )
    report: dict[str, Any] = {"from": str(role_dir), "saved_layout": meta.get("saved_layout"), "model": True}
    with torch.no_grad(), no_code_unpickling():
        with load_errors(role_dir, "model"):
            load_model(modules, role_dir, adapters_only=lora is not None)
        if train_optimizer is None or not load_optimizer:
            report["optimizer"] = "not loaded"
        elif not meta.get("has_optimizer"):
            report["optimizer"] = "not saved (no optimizer step before the save)"
        else:
            with load_errors(role_dir, "optimizer state"):
                _init_adam_state(train_optimizer)
                opt = train_optimizer.optimizer
                sharded = opt.sharded_state_dict(
                    _sharded_state(modules), is_loading=True, metadata=OPTIMIZER_METADATA
                )
                opt_dir = role_dir / OPTIMIZER_DIR
                saved_common = dist_checkpointing.load_common_state_dict(str(opt_dir))
                if same_chain(saved_common, sharded):
                    state = dist_checkpointing.load(sharded, str(opt_dir))
                else:  # an MoE checkpoint of another expert-parallel size
                    state = load_across_chains(sharded, saved_common, opt_dir, role_dir)
                with _states_without_step(train_optimizer):
                    opt.load_state_dict(state)
                _unshare_steps(train_optimizer)
            report["optimizer"] = "loaded"
    if train_optimizer is not None and load_schedule(role_dir, train_optimizer.scheduler):
        report["num_updates"] = train_optimizer.num_updates
    same_layout = meta.get("layout") == rng_state.layout_of(layout)
    report["extra_state"], report["rng"] = load_rank_state(role_dir, rank, same_layout, load_rng)
    report["verified_files"] = len(manifest["files"])
    report["seconds"] = time.perf_counter() - start
    return report
