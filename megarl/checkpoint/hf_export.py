"""Write Hugging Face checkpoints, streaming into size-bounded safetensors shards, atomically.

Two sources, one shard writer (safetensors_shards):
- `export_hf`: a live Megatron model at any TP/PP layout (collective over the model's world). TP ranks
  gather each tensor; the first DP replica's TP rank 0 of each PP stage writes that stage's shards; rank 0
  writes the index and the config/tokenizer files.
- `export_checkpoint_hf`: a megarl checkpoint directory, in one process without megatron: tensors are
  read one layer at a time from the dist-checkpoint (dist_reader). An adapter-only (LoRA) checkpoint
  becomes a PEFT adapter directory, or with `merge_lora` its base with the adapters merged
  (megarl.checkpoint.lora_export). An FSDP role's checkpoint
  (megarl.fsdp.checkpoint) already holds transformers' names: its model is rebuilt from hf/config.json,
  filled from the DCP and written by its own `save_pretrained` (the whole model in memory once).

A scalar-head model (a critic, a reward model from `megarl rm`) is written as a sequence classifier
(`<Family>ForSequenceClassification`, one label, `score.weight`) that transformers loads.

Both plan the shards first from meta tensors (names, shapes, dtypes), then write each tensor as it comes,
so memory holds one tensor (live) or one layer (checkpoint), never a shard or the model. The output is
staged in `<out>.partial` and renamed into place only once complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from megarl.checkpoint import manifest as mf
from megarl.checkpoint.dist_reader import (
    DistCheckpointReader,
    checkpoint_megatron_tensors,
    truncated_files,
)
from megarl.checkpoint.format import (
    CheckpointError,
    begin_write,
    finish_write,
    partial_dir,
    read_meta,
)
from megarl.checkpoint.lora_export import read_checkpoint_adapter, write_lora_export
from megarl.checkpoint.lora_state import LORA_KEY
from megarl.checkpoint.safe_load import no_code_unpickling
from megarl.errors import MegarlError
from megarl.models.convert import llama
from megarl.models.convert.hf_io import copy_hf_metadata, write_classifier_config
from megarl.models.convert.loader import (
    expert_peer_names,
    full_megatron_tensors,
    global_named_parameters,
    to_hf_tensors,
)
from megarl.models.convert.safetensors_shards import (
    DEFAULT_MAX_SHARD_SIZE,
    ShardWriter,
    TensorSpec,
    parse_size,
    plan_shards,
    write_index,
)
from megarl.models.convert.sharding import unshard
from megarl.models.from_hf import ModelArchitecture
from megarl.output_guard import OutputWriteError, check_apart, check_replaceable


def _stage_meta_tensors(
    chunks: list[torch.nn.Module], arch: ModelArchitecture, tp: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """What full_megatron_tensors yields on this rank, as meta tensors (no communication): routed
    experts gathered over expert-TP and, for every EP rank's experts, EP."""
    from megatron.core import parallel_state as ps

    etp, ep = ps.get_expert_tensor_parallel_world_size(), ps.get_expert_model_parallel_world_size()
    for chunk in chunks:
        for name, param in global_named_parameters(chunk):
            if getattr(param, "shared", False):
                continue
            entry, _ = llama.param_map(name, arch)
            local = torch.empty(param.shape, dtype=param.dtype, device="meta")
            size = etp if entry.expert else tp
            shards = [local] * (size if size > 1 and entry.kind.tp_sharded else 1)
            full = unshard(entry.kind, shards, vocab_size=arch.vocab_size)
            for peer in expert_peer_names(name, arch, ep) if entry.expert and ep > 1 else [name]:
                yield peer, full


def export_hf(
    chunks: list[torch.nn.Module],
    arch: ModelArchitecture,
    source_hf_dir: str,
    out_dir: str | Path,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Save `chunks` (this rank's model chunks) as an HF checkpoint at `out_dir`; returns the path."""
    from megatron.core import parallel_state as ps

    out_dir = Path(out_dir)
    max_bytes = parse_size(max_shard_size)
    staging = begin_write(out_dir, overwrite=True)  # collective
    tp, stage = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    is_writer = (
        ps.get_data_parallel_rank(with_context_parallel=True) == 0
        and ps.get_tensor_model_parallel_rank() == 0
    )
    own = None
    if is_writer:
        own = (
            stage,
            [TensorSpec.of(n, t) for n, t in to_hf_tensors(_stage_meta_tensors(chunks, arch, tp), arch)],
        )
    stages = [None] * dist.get_world_size()
    dist.all_gather_object(stages, own)
    by_stage = sorted((s for s in stages if s is not None), key=lambda s: s[0])  # one writer per stage
    plan = plan_shards([specs for _, specs in by_stage], max_bytes)
    writer = ShardWriter(staging, plan, group=stage) if is_writer else None
    failure = None
    for name, tensor in to_hf_tensors(full_megatron_tensors(chunks, arch), arch):  # TP collective
        if writer is not None and failure is None:
            try:
                writer.write(name, tensor)
            except (OSError, ValueError, KeyError) as e:  # keep iterating: the TP peers are in collectives
                failure = f"writing {name} into {staging} failed on rank {dist.get_rank()}: {e}"
    try:
        if writer is not None and failure is None:
            writer.close()
        if dist.get_rank() == 0 and failure is None:
            (staging / "model").rmdir()  # begin_write's layout is the dist-checkpoint's
            write_index(staging, plan)
            copy_hf_metadata(source_hf_dir, staging)
            if arch.head == "scalar":  # a critic or reward model: a sequence classifier, `score.weight`
                write_classifier_config(staging)
    except (OSError, ValueError) as e:
        failure = f"writing the HF checkpoint {out_dir} failed on rank {dist.get_rank()}: {e}"
    failures = [None] * dist.get_world_size()
    dist.all_gather_object(failures, failure)  # every rank fails together instead of hanging in a barrier
    if any(failures):
        raise OSError("; ".join(f for f in failures if f))
    finish_write(staging, out_dir)  # collective
    return out_dir


def export_checkpoint_hf(
    ckpt_dir: str | Path,
    out_dir: str | Path,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    overwrite: bool = False,
    merge_lora: bool = False,
    base: str | Path | None = None,
) -> dict:
    """Write the megarl checkpoint at `ckpt_dir` (a role or converted checkpoint) as an HF checkpoint at
    `out_dir`, one layer in memory at a time. One process, no torch.distributed; returns a summary.
    `out_dir` may not be, contain or lie inside `ckpt_dir`; `overwrite` replaces an earlier export but
    never a training run or trained checkpoint (megarl.output_guard). A failed export leaves no
    `<out_dir>.partial`, and errors name the side at fault: the checkpoint read or the output written.
    A LoRA checkpoint is written as a PEFT adapter, with `merge_lora` as the merged model of its base
    (`base`, else the base path it recorded)."""
    start = time.perf_counter()
    ckpt_dir, out_dir = Path(ckpt_dir), Path(out_dir)
    meta = read_meta(ckpt_dir)
    check_apart(out_dir, {"the checkpoint it exports": ckpt_dir}, "--out")
    if out_dir.exists():
        if not overwrite:
            raise FileExistsError(
                f"{out_dir} already exists; remove it, choose another --out or pass --overwrite"
            )
        check_replaceable(out_dir, "--out")
    if (ckpt_dir / mf.MANIFEST_FILE).is_file():  # a run's role checkpoint: check it is whole first
        problems = mf.check_files(ckpt_dir, mf.read_manifest(ckpt_dir))
        if problems:
            raise CheckpointError(
                f"{ckpt_dir} is incomplete or damaged:\n  "
                + "\n  ".join(problems)
                + "\nexport an earlier checkpoint (--ckpt <run>/checkpoints/step_<N>); this one cannot be repaired"
            )
    if LORA_KEY in meta:
        with no_code_unpickling(), _read_errors(ckpt_dir):
            adapter = read_checkpoint_adapter(ckpt_dir, meta)
        with _write_errors(out_dir, sum(t.numel() * t.element_size() for t in adapter.values())):
            result = write_lora_export(adapter, meta, out_dir, merge_lora, base, max_shard_size)
        return {
            **result,
            "out": str(out_dir),
            "from": str(ckpt_dir),
            "seconds": round(time.perf_counter() - start, 2),
        }
    if merge_lora or base is not None:
        raise CheckpointError(
            f"{ckpt_dir} is a full checkpoint, not a LoRA one: --merge-lora and --base apply to adapter "
            "checkpoints only; leave them out"
        )
    if meta.get("backend") == "fsdp":
        return _export_fsdp_checkpoint(ckpt_dir, out_dir, meta, start)
    arch = ModelArchitecture.from_pretrained(ckpt_dir / "hf")
    if meta.get("architecture", {}).get("head") == "scalar":  # hf/ is the source LM's config
        arch = arch.with_scalar_head()
    # DCP's metadata is a pickle: read it (and every tensor record) without running code from the file
    with no_code_unpickling(), _read_errors(ckpt_dir):
        reader = DistCheckpointReader(ckpt_dir / "model")
        specs = [
            TensorSpec.of(n, t)
            for n, t in to_hf_tensors(checkpoint_megatron_tensors(reader, arch, meta=True), arch)
        ]
        plan = plan_shards([specs], parse_size(max_shard_size))
    total = plan.index()["metadata"]["total_size"]
    staging = partial_dir(out_dir)
    try:
        with _write_errors(out_dir, total):
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            writer = ShardWriter(staging, plan)
        with no_code_unpickling(), _read_errors(ckpt_dir):
            for name, tensor in to_hf_tensors(checkpoint_megatron_tensors(reader, arch), arch):
                with _write_errors(out_dir, total):
                    writer.write(name, tensor)
        with _write_errors(out_dir, total):
            writer.close()
            write_index(staging, plan)
            copy_hf_metadata(ckpt_dir / "hf", staging)
            if arch.head == "scalar":
                write_classifier_config(staging)
            if out_dir.exists():
                shutil.rmtree(out_dir)
            staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a failed export leaves nothing half-written
        raise
    return {
        "out": str(out_dir),
        "from": str(ckpt_dir),
        "dtype": meta["dtype"],
        "shards": len(plan.shards),
        "bytes": total,
        "seconds": round(time.perf_counter() - start, 2),
    }


def _export_fsdp_checkpoint(ckpt_dir: Path, out_dir: Path, meta: dict, start: float) -> dict:
    """An FSDP role's checkpoint (megarl.fsdp.checkpoint: transformers' own parameter names in a DCP) as
    that model's `save_pretrained` output. The whole model is in memory once (as in training)."""
    import transformers
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load

    name = meta.get("model_class", "")
    model_cls = getattr(transformers, name, None)
    if model_cls is None:
        raise CheckpointError(
            f"{ckpt_dir} holds a {name or 'model of no recorded class'}, which transformers "
            f"{transformers.__version__} does not have; export it with the transformers it was trained with"
        )
    config = transformers.AutoConfig.from_pretrained(ckpt_dir / "hf")
    with torch.device("meta"):
        model = model_cls(config)
    model.to_empty(device="cpu")  # every stored entry is read into it below
    model.tie_weights()  # to_empty gave tied parameters a tensor each
    with no_code_unpickling(), _read_errors(ckpt_dir):
        stored = FileSystemReader(str(ckpt_dir / "model")).read_metadata().state_dict_metadata
        state = {k: v for k, v in model.state_dict().items() if k in stored}
        missing = sorted(set(model.state_dict()) - set(stored) - set(tied_names(model)))
        if missing:
            raise CheckpointError(f"{ckpt_dir}/model lacks {', '.join(missing[:5])} of a {name}")
        dcp_load(state, checkpoint_id=str(ckpt_dir / "model"), no_dist=True)
    staging = partial_dir(out_dir)
    try:
        with _write_errors(out_dir, sum(t.numel() * t.element_size() for t in state.values())):
            shutil.rmtree(staging, ignore_errors=True)
            copy_hf_metadata(ckpt_dir / "hf", staging)  # the tokenizer; save_pretrained writes the configs
            model.save_pretrained(staging)
            if out_dir.exists():
                shutil.rmtree(out_dir)
            staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a failed export leaves nothing half-written
        raise
    return {
        "out": str(out_dir),
        "from": str(ckpt_dir),
        "dtype": meta.get("dtype"),
        "backend": "fsdp",
        "bytes": sum((out_dir / f).stat().st_size for f in os.listdir(out_dir) if f.endswith(".safetensors")),
        "seconds": round(time.perf_counter() - start, 2),
    }


def tied_names(model: torch.nn.Module) -> list[str]:
    """Parameter names that share their tensor with an earlier one (tied embeddings): not stored apart."""
    seen: set[int] = set()
    tied = []
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            tied.append(key)
        seen.add(id(tensor))
    return tied


@contextlib.contextmanager
def _read_errors(ckpt_dir: Path) -> Iterator[None]:
    """A checkpoint that cannot be read becomes a CheckpointError naming it, and its damaged file when
    the dist-checkpoint's metadata tells (no deep DCP traceback)."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        yield
    except MegarlError:
        raise
    except (Exception, CheckpointException) as e:
        damaged = truncated_files(ckpt_dir / "model")
        if damaged:
            raise CheckpointError(
                f"{ckpt_dir} is damaged: {'; '.join(damaged)}; export an earlier checkpoint or convert again"
            ) from None
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(
            f"{ckpt_dir} cannot be read as a megarl checkpoint ({type(e).__name__}: {first}); "
            "export an earlier checkpoint or convert again"
        ) from None


@contextlib.contextmanager
def _write_errors(out_dir: Path, needed_bytes: int) -> Iterator[None]:
    """An output that cannot be written (read-only, a full disk) becomes an OutputWriteError naming it."""
    try:
        yield
    except OSError as e:
        raise OutputWriteError.of(e, out_dir, needed_bytes) from None
