"""`megarl convert`: Hugging Face <-> megarl megatron checkpoints.

megarl convert hf-to-mcore --hf DIR --out DIR --tp N --pp N
megarl convert mcore-to-hf --ckpt CKPT|STEP|RUN [--role R] --out DIR [--max-shard-size 5GB]
                           [--merge-lora] [--base DIR]   (a LoRA checkpoint: a PEFT adapter, or merged)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from megarl.cli.errors import UsageError
from megarl.cli.rank_jobs import check_launch, launch


def register(commands: argparse._SubParsersAction) -> None:
    from megarl.models.dtypes import DTYPE_NAMES

    convert = commands.add_parser("convert", help="HF <-> megatron checkpoints").add_subparsers(
        dest="direction", required=True
    )
    to_mcore = convert.add_parser("hf-to-mcore", help="HF safetensors -> megarl megatron dist-checkpoint")
    to_mcore.add_argument("--hf", required=True)
    to_mcore.add_argument("--out", required=True)
    to_mcore.add_argument("--tp", type=int, default=1)
    to_mcore.add_argument("--pp", type=int, default=1)
    to_mcore.add_argument("--vpp", type=int, default=None)
    to_mcore.add_argument("--ep", type=int, default=1, help="expert-parallel size (MoE models)")
    to_mcore.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="default: the HF dtype")
    to_mcore.add_argument("--overwrite", action="store_true")
    to_mcore.set_defaults(func=convert_checkpoint)
    to_hf = convert.add_parser("mcore-to-hf", help="megarl megatron checkpoint -> HF safetensors")
    to_hf.add_argument(
        "--ckpt",
        required=True,
        help="a megarl checkpoint, a run's checkpoints/step_N, its checkpoints/latest, checkpoints/ or the run dir",
    )
    to_hf.add_argument("--role", default="actor", help="which role of a run's step to export (actor, critic)")
    to_hf.add_argument("--out", required=True)
    to_hf.add_argument(
        "--max-shard-size",
        default="5GB",
        help="largest safetensors file, like save_pretrained: 5GB, 500MB, 2GiB",
    )
    to_hf.add_argument(
        "--merge-lora",
        action="store_true",
        help="a LoRA checkpoint: write its base with the adapters merged, not a PEFT adapter directory",
    )
    to_hf.add_argument(
        "--base", default=None, help="a LoRA checkpoint's base HF model (default: the path it recorded)"
    )
    to_hf.add_argument("--overwrite", action="store_true")
    to_hf.set_defaults(func=convert_checkpoint)


def _check_out(out: Path, inputs: dict[str, str | Path], overwrite: bool) -> None:
    """Before anything is written: --out is apart from the inputs, and replaced only with --overwrite and
    only when it holds no training run or trained checkpoint."""
    from megarl.output_guard import check_apart, check_replaceable

    check_apart(out, inputs, "--out")
    if out.exists():
        if not overwrite:
            raise UsageError(
                f"--out {out} already exists; remove it, choose another --out or pass --overwrite"
            )
        check_replaceable(out, "--out")


def convert_checkpoint(args: argparse.Namespace) -> int:
    if args.direction == "mcore-to-hf":
        return _mcore_to_hf(args)
    _check_out(Path(args.out), {"--hf": args.hf}, args.overwrite)
    nproc = args.tp * args.pp * args.ep
    check_launch(args.hf, args.tp, args.pp, args.vpp, nproc, args.ep > 1 and args.tp > 1, args.ep)
    worker_args = [
        "hf-to-mcore",
        "--hf",
        args.hf,
        "--out",
        args.out,
        "--tp",
        str(args.tp),
        "--pp",
        str(args.pp),
        "--ep",
        str(args.ep),
    ]
    worker_args += ["--vpp", str(args.vpp)] if args.vpp else []
    worker_args += ["--dtype", args.dtype] if args.dtype else []
    worker_args += ["--overwrite"] if args.overwrite else []
    outcome = launch("megarl.checkpoint.convert_program", worker_args, nproc)
    for result in outcome["results"]:
        print(json.dumps(result))
    return outcome["returncode"]


def _mcore_to_hf(args: argparse.Namespace) -> int:
    """In this process: the export reads the dist-checkpoint layer by layer without megatron or ranks."""
    from megarl.checkpoint.format import read_meta
    from megarl.checkpoint.hf_export import export_checkpoint_hf
    from megarl.checkpoint.paths import resolve_role_checkpoint
    from megarl.models.convert.safetensors_shards import parse_size

    try:
        max_shard_bytes = parse_size(args.max_shard_size)
    except ValueError as e:
        raise UsageError(f"--max-shard-size: {e}") from None
    ckpt = resolve_role_checkpoint(args.ckpt, args.role)
    meta = read_meta(ckpt)
    # --merge-lora reads the base model: --base, else the one the LoRA checkpoint records
    base = args.base or (meta.get("lora") or {}).get("base_model_path")
    inputs = {"the checkpoint --ckpt names": ckpt, **({"the base model (--base)": base} if base else {})}
    _check_out(Path(args.out), inputs, args.overwrite)
    result = export_checkpoint_hf(
        ckpt, args.out, max_shard_bytes, args.overwrite, merge_lora=args.merge_lora, base=args.base
    )
    print(json.dumps(result))
    return 0
