"""Models: build a tiny one offline, check megatron against transformers.

megarl tiny-model --out DIR [--family F]      a tiny random HF model + tokenizer, built offline
                                              (phi3, gemma2: transformers + vLLM only, for the FSDP backend)
megarl verify-model --hf DIR --tp N --pp N [--nproc N] [--dtype bf16] [--json]
megarl parity-check [--out DIR]               Megatron vs transformers at 4 layouts, checkpoint round trip
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from megarl.cli.errors import UsageError
from megarl.cli.rank_jobs import check_launch, launch

# megarl.models.tiny.ALL_TINY_FAMILIES (not imported here: transformers is slow to import)
TINY_FAMILY_NAMES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "phi3", "gemma2"]


def register(commands: argparse._SubParsersAction) -> None:
    tiny = commands.add_parser("tiny-model", help="build a tiny random HF model + tokenizer offline")
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--family", default="llama", choices=TINY_FAMILY_NAMES)
    tiny.add_argument("--layers", type=int, default=None)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--initializer-range", type=float, default=None, help="weights' std (HF default 0.02; 0.1: logits ~5)"
    )
    tiny.set_defaults(func=tiny_model)

    verify = commands.add_parser(
        "verify-model", help="compare megatron logits/grads with transformers at a layout"
    )
    verify.add_argument("--hf", required=True)
    verify.add_argument("--tp", type=int, default=1)
    verify.add_argument("--pp", type=int, default=1)
    verify.add_argument("--vpp", type=int, default=None)
    verify.add_argument("--ep", type=int, default=1, help="expert-parallel size (MoE models)")
    verify.add_argument("--sequence-parallel", action="store_true")
    verify.add_argument(
        "--nproc", type=int, default=None, help="ranks to launch (default tp*pp*ep; more = DP)"
    )
    verify.add_argument("--tolerance", type=float, default=5e-5, help="max |Δlogits| allowed (fp32)")
    verify.add_argument(
        "--dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="bf16: both sides in bf16, megatron's error against the fp32 reference within "
        "megarl.models.verify.BF16_FACTOR x transformers' own (plus a floor)",
    )
    verify.add_argument("--json", action="store_true", help="print one JSON line per layout")
    verify.add_argument(
        "--lora-adapter", default=None, help="a PEFT adapter dir: compare megatron's LoRA with PEFT's instead"
    )
    verify.set_defaults(func=verify_model)

    parity = commands.add_parser("parity-check", help="Megatron vs transformers at 4 layouts, round trip")
    parity.add_argument("--out", default="outputs/parity_check")
    parity.set_defaults(func=parity_check)


def tiny_model(args: argparse.Namespace) -> int:
    from megarl.models.tiny import build_tiny_hf

    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    if args.initializer_range:
        overrides["initializer_range"] = args.initializer_range
    print(build_tiny_hf(args.out, family=args.family, seed=args.seed, **overrides))
    return 0


def verify_model(args: argparse.Namespace) -> int:
    nproc = args.nproc or args.tp * args.pp * args.ep
    check_launch(args.hf, args.tp, args.pp, args.vpp, nproc, args.sequence_parallel, args.ep)
    layout = (
        f"tp{args.tp}pp{args.pp}"
        + (f"vpp{args.vpp}" if args.vpp else "")
        + (f"ep{args.ep}" if args.ep > 1 else "")
        + ("sp" if args.sequence_parallel else "")
    )
    worker_args = ["--hf", args.hf, "--layouts", layout, "--tolerance", str(args.tolerance)]
    program = "megarl.models.verify"
    if args.lora_adapter and args.dtype != "fp32":
        raise UsageError("--lora-adapter compares with PEFT in fp32 only; drop --dtype bf16")
    if args.dtype != "fp32":
        worker_args += ["--dtype", args.dtype]
    if args.lora_adapter:
        program, worker_args = (
            "megarl.models.lora.verify",
            [*worker_args, "--lora-adapter", args.lora_adapter],
        )
    outcome = launch(program, worker_args, nproc)
    for r in outcome["results"]:
        if args.json:
            print(json.dumps(r))
        else:
            verdict = "OK" if r["passed"] else "FAILED"
            if r.get("dtype") == "bf16":
                errors = ", ".join(
                    f"{m} {v['megatron_bf16_err']:.2e} vs HF {v['hf_bf16_err']:.2e} (bound {v['bound']:.2e})"
                    for m, v in r["bf16"].items()
                )
                print(f"{verdict} {r['family']} {r['layout']} bf16 error against fp32 HF: {errors}")
                continue
            print(
                f"{verdict} {r['family']} {r['layout']}: max|Δlogits|={r['max_abs_logit_diff']:.2e} "
                f"(tolerance {r['tolerance']:.0e}), |Δloss|={r['loss_abs_diff']:.2e}, "
                f"max|Δgrad|={r['max_abs_grad_diff']:.2e}, grad-norm rel. diff={r['grad_norm_rel_diff']:.2e}"
            )
    return 0 if outcome["results"] and all(r["passed"] for r in outcome["results"]) else 1


def parity_check(args: argparse.Namespace) -> int:
    from megarl.parity_check import run_parity_check

    return run_parity_check(Path(args.out))
