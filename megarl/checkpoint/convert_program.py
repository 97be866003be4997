"""The rank program of `megarl convert` (megarl.distributed.rank_program): HF <-> megarl megatron
checkpoints. Its spec is an argv: `hf-to-mcore --hf DIR --out DIR --tp N --pp N ...` or
`mcore-to-hf --ckpt PATH --out DIR [--role R] [--max-shard-size S] [--merge-lora] [--base DIR]`."""

from __future__ import annotations

import argparse
import shutil
import time

import torch.distributed as dist

from megarl.checkpoint import format as ckpt
from megarl.checkpoint.hf_export import export_checkpoint_hf
from megarl.checkpoint.paths import resolve_role_checkpoint
from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.convert.safetensors_shards import DEFAULT_MAX_SHARD_SIZE
from megarl.models.dtypes import DTYPE_NAMES, from_hf_name
from megarl.models.from_hf import ModelArchitecture
from megarl.output_guard import OutputWriteError, os_error_in


def hf_dtype(arch: ModelArchitecture) -> str:
    name = str(arch.hf_config.get("dtype") or arch.hf_config.get("torch_dtype") or "float32")
    return from_hf_name(name)


def hf_to_mcore(args: argparse.Namespace) -> dict:
    from megatron.core import parallel_state as ps

    arch = ModelArchitecture.from_pretrained(args.hf)
    layout = ParallelLayout(
        world_size=dist.get_world_size(),
        tp=args.tp,
        pp=args.pp,
        vpp=args.vpp,
        ep=args.ep,
        sequence_parallel=args.ep > 1 and args.tp > 1,  # megatron's MoE rule; the weights are the same
    )
    layout.initialize()
    dtype = args.dtype or hf_dtype(arch)
    chunks = build_model_chunks(arch, layout, dtype, args.make_vocab_size_divisible_by)
    loaded = load_hf_into_chunks(
        chunks, arch, HFCheckpointReader(args.hf), ps.get_tensor_model_parallel_rank(), layout.tp
    )
    padded = chunks[0].vocab_size
    staging = ckpt.begin_write(args.out, overwrite=args.overwrite)
    meta = {
        "dtype": dtype,
        "padded_vocab_size": padded,
        "saved_layout": layout.describe(),
        "source": str(args.hf),
    }
    try:
        ckpt.save_model(chunks, staging, meta, args.hf)
        ckpt.finish_write(staging, args.out)
    except BaseException as e:
        if dist.get_rank() == 0:  # a failed conversion leaves no .partial behind
            shutil.rmtree(staging, ignore_errors=True)
        if (cause := os_error_in(e)) is not None:
            raise OutputWriteError.of(cause, args.out) from None
        raise
    return {"out": str(args.out), "layout": layout.describe(), "params_loaded_rank0": loaded, "dtype": dtype}


def mcore_to_hf(args: argparse.Namespace) -> dict:
    """One process suffices (the CLI calls export_checkpoint_hf directly); kept for rank programs."""
    ckpt_dir = resolve_role_checkpoint(args.ckpt, args.role)
    if dist.get_rank() != 0:
        return {}
    return export_checkpoint_hf(
        ckpt_dir, args.out, args.max_shard_size, overwrite=True, merge_lora=args.merge_lora, base=args.base
    )


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="megarl.checkpoint.convert_program", description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    to_mcore = sub.add_parser("hf-to-mcore")
    to_mcore.add_argument("--hf", required=True)
    to_mcore.add_argument("--out", required=True)
    to_mcore.add_argument("--tp", type=int, default=1)
    to_mcore.add_argument("--pp", type=int, default=1)
    to_mcore.add_argument("--vpp", type=int, default=None)
    to_mcore.add_argument("--ep", type=int, default=1)
    to_mcore.add_argument("--dtype", choices=DTYPE_NAMES, default=None)
    to_mcore.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    to_mcore.add_argument("--overwrite", action="store_true")
    to_hf = sub.add_parser("mcore-to-hf")
    to_hf.add_argument("--ckpt", required=True)
    to_hf.add_argument("--out", required=True)
    to_hf.add_argument("--role", default="actor")
    to_hf.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE)
    to_hf.add_argument("--merge-lora", action="store_true")
    to_hf.add_argument("--base", default=None)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    result = (hf_to_mcore if args.mode == "hf-to-mcore" else mcore_to_hf)(args)
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result
