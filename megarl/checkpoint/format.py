"""megarl's megatron checkpoint: a megatron dist-checkpoint plus the HF metadata to rebuild the model.

Layout of a checkpoint directory:
  megarl_checkpoint.json   format version, dtype, padded vocabulary, the layout it was saved from
  hf/                      config.json, generation config and tokenizer files of the source model
  model/                   megatron dist-checkpoint (torch_dist): loadable at any TP/PP/VPP layout

Writes go to `<dir>.partial` and are renamed into place only when every rank has finished, so a
crash never leaves a directory that looks complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megarl.checkpoint.paths import META_FILE, PARTIAL_SUFFIX
from megarl.distributed.layout import ParallelLayout
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.output_guard import OutputWriteError

FORMAT_VERSION = 1


class CheckpointError(MegarlError, ValueError):
    """A checkpoint directory that is missing, incomplete or not a megarl checkpoint."""

    exit_code = EXIT_USAGE


def partial_dir(out_dir: str | Path) -> Path:
    return Path(str(out_dir).rstrip("/") + PARTIAL_SUFFIX)


def begin_write(out_dir: str | Path, overwrite: bool = False) -> Path:
    """Rank 0 prepares an empty staging directory; every rank gets its path."""
    out_dir = Path(out_dir)
    staging = partial_dir(out_dir)
    if out_dir.exists() and not overwrite:  # checked on every rank, so all of them stop together
        raise CheckpointError(
            f"{out_dir} already exists; remove it, choose another --out or pass --overwrite"
        )
    error = None
    if dist.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            (staging / "model").mkdir(parents=True)
        except OSError as e:
            error = str(OutputWriteError.of(e, out_dir))
    failed = [error]
    dist.broadcast_object_list(failed, src=0)  # every rank stops together instead of some waiting
    if failed[0]:
        raise OutputWriteError(failed[0])
    return staging


def finish_write(staging: Path, out_dir: str | Path) -> None:
    """After every rank wrote its part: rank 0 moves the staging directory into place."""
    dist.barrier()
    if dist.get_rank() == 0:
        out_dir = Path(out_dir)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    dist.barrier()


def _trained_base(chunk: torch.nn.Module) -> set[str]:
    """Names of the trained parameters of a LoRA chunk that are no adapter (a critic's value head)."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return {n for n, p in chunk.named_parameters() if p.requires_grad and ".lora." not in n}


def _sharded_state(chunks: list[torch.nn.Module], adapters_only: bool = False) -> dict[str, Any]:
    """The chunks' sharded state dicts by chunk; `adapters_only`: their LoRA adapters' entries alone."""
    from megarl.checkpoint.lora_state import adapter_entries

    states = [chunk.sharded_state_dict() for chunk in chunks]
    if adapters_only:
        states = [adapter_entries(state, _trained_base(chunk)) for state, chunk in zip(states, chunks)]
    if len(chunks) == 1:
        return {"model": states[0]}
    return {f"model{i}": state for i, state in enumerate(states)}


def write_results_in_process() -> None:
    """Megatron's save hands its writer processes' results back through a queue it creates on first use
    from a spawn-context `multiprocessing.Manager()`: a fresh interpreter (~3 s of the first save of every
    process on CPU, the later saves 0.5 s) and a server process that lives as long as the rank. megarl
    saves synchronously, where the process that writes is the one that reads
    (`write_preloaded_data_multiproc` puts, `retrieve_write_results` takes with get_nowait): an
    in-process queue carries them. Call before a save; idempotent."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()


def save_model(
    chunks: list[torch.nn.Module],
    staging: Path,
    meta: dict[str, Any],
    hf_dir: str | Path,
    sharded_strategy: Any = None,
    adapters_only: bool = False,
) -> None:
    """Collective: every rank writes its shards; rank 0 writes the metadata and HF files.
    `sharded_strategy`: megatron's save strategy (None: its default, torch_dist); `adapters_only`: only
    the LoRA adapters (the base is the model path's)."""
    from megatron.core import dist_checkpointing

    from megarl.models.convert.hf_io import copy_hf_metadata

    state = _sharded_state(chunks, adapters_only)
    write_results_in_process()
    dist_checkpointing.save(state, str(staging / "model"), sharded_strategy)
    if dist.get_rank() == 0:
        copy_hf_metadata(hf_dir, staging / "hf")
        (staging / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2))


def read_meta(ckpt_dir: str | Path) -> dict[str, Any]:
    ckpt_dir = Path(ckpt_dir)
    if partial_dir(ckpt_dir).exists() and not ckpt_dir.exists():
        raise CheckpointError(
            f"{ckpt_dir} was never completed (only {partial_dir(ckpt_dir)} exists: the save or conversion "
            "was interrupted); use an earlier checkpoint or re-run the conversion"
        )
    meta_file = ckpt_dir / META_FILE
    if not meta_file.is_file():
        raise CheckpointError(
            f"{ckpt_dir} is not a megarl checkpoint (no {META_FILE}); create one with `megarl convert hf-to-mcore`"
        )
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{meta_file} is corrupt ({e}); re-run the conversion") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{ckpt_dir}: checkpoint format {meta.get('format_version')} is not {FORMAT_VERSION}"
        )
    # megatron's dist-checkpoint has its own metadata.json; an FSDP role's plain DCP only `.metadata`
    marker = "model/.metadata" if meta.get("backend") == "fsdp" else "model/metadata.json"
    if not (ckpt_dir / marker).is_file() or not (ckpt_dir / "hf" / "config.json").is_file():
        raise CheckpointError(f"{ckpt_dir} is incomplete ({marker} or hf/config.json missing)")
    return meta


def padded_vocab_for(meta: dict[str, Any], layout: ParallelLayout) -> int:
    """The saved padded vocabulary, which must split evenly over the new TP size."""
    padded = meta["padded_vocab_size"]
    if padded % layout.tp:
        raise CheckpointError(
            f"the checkpoint's padded vocabulary ({padded}) does not split over tp={layout.tp}; "
            f"load it with a tp that divides {padded}, or convert again from HF at this tp"
        )
    return padded


def load_model(chunks: list[torch.nn.Module], ckpt_dir: str | Path, adapters_only: bool = False) -> None:
    """Collective: fill `chunks` (any layout) from the checkpoint's dist-checkpoint (no code from the
    files runs: `safe_load.no_code_unpickling`); `adapters_only`: only their LoRA adapters, from an
    adapter-only checkpoint (the base weights stay as loaded from the model path)."""
    from megatron.core import dist_checkpointing

    from megarl.checkpoint.lora_state import ADAPTER_MARK
    from megarl.checkpoint.safe_load import no_code_unpickling

    with no_code_unpickling():
        state = dist_checkpointing.load(_sharded_state(chunks, adapters_only), str(Path(ckpt_dir) / "model"))
    for i, chunk in enumerate(chunks):
        keys = chunk.load_state_dict(
            state["model" if len(chunks) == 1 else f"model{i}"], strict=not adapters_only
        )
        missing = [k for k in keys.missing_keys if ADAPTER_MARK in k]  # strict=False: check the adapters
        if missing:
            raise CheckpointError(f"{ckpt_dir}: the adapters {', '.join(missing[:3])} were not loaded")
