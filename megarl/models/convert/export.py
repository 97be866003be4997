"""Write a live Megatron model (any TP/PP layout) as a Hugging Face checkpoint, atomically.

Collective over the model's world: TP ranks gather each tensor, the first DP replica's TP rank 0 of each
PP stage writes that stage's tensors, rank 0 writes the index and the config/tokenizer files. The
directory appears under its final name only once everything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from megarl.models.convert.hf_io import copy_hf_metadata
from megarl.models.convert.loader import full_megatron_tensors, to_hf_tensors
from megarl.models.convert.mcore_checkpoint import begin_write, finish_write
from megarl.models.from_hf import ModelArchitecture


def export_hf(
    chunks: list[torch.nn.Module], arch: ModelArchitecture, source_hf_dir: str, out_dir: str | Path
) -> Path:
    """Save `chunks` (this rank's model chunks) as an HF checkpoint at `out_dir`; returns the path."""
    from megatron.core import parallel_state as ps

    out_dir = Path(out_dir)
    staging = begin_write(out_dir, overwrite=True)  # collective
    tensors = {
        name: t.detach().cpu().contiguous().clone()
        for name, t in to_hf_tensors(full_megatron_tensors(chunks, arch), arch)
    }
    stage, stages = ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()
    writer = (
        ps.get_data_parallel_rank(with_context_parallel=True) == 0
        and ps.get_tensor_model_parallel_rank() == 0
    )
    file = "model.safetensors" if stages == 1 else f"model-{stage + 1:05d}-of-{stages:05d}.safetensors"
    if writer:
        save_file(tensors, staging / file, metadata={"format": "pt"})
    listing = [None] * dist.get_world_size()
    own = {name: (file, t.numel() * t.element_size()) for name, t in tensors.items()} if writer else {}
    dist.all_gather_object(listing, own)
    failure = None
    if dist.get_rank() == 0:
        try:
            (staging / "model").rmdir()  # begin_write's layout is the dist-checkpoint's
            if stages > 1:
                merged = {name: entry for part in listing for name, entry in part.items()}
                index = {
                    "metadata": {"total_size": sum(size for _, size in merged.values())},
                    "weight_map": {name: f for name, (f, _) in sorted(merged.items())},
                }
                (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
            copy_hf_metadata(source_hf_dir, staging)
        except OSError as e:
            failure = f"writing the HF checkpoint {out_dir} failed on rank 0: {e}"
    outcome = [failure]
    dist.broadcast_object_list(outcome, src=0)  # every rank fails together instead of hanging in a barrier
    if outcome[0]:
        raise OSError(outcome[0])
    finish_write(staging, out_dir)  # collective
    return out_dir
