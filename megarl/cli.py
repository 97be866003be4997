"""`megarl` command line: one entry point, one sub-command per job.

megarl config show CONFIG [key=value ...]     resolved config, or the validation problems (exit 2)
megarl tiny-model --out DIR [--family F]      a tiny random HF model + tokenizer, built offline
megarl convert hf-to-mcore --hf DIR --out DIR --tp N --pp N
megarl convert mcore-to-hf --ckpt CKPT|STEP|RUN [--role R] --out DIR [--max-shard-size 5GB]
megarl verify-model --hf DIR --tp N --pp N [--nproc N] [--json]
megarl train CONFIG [key=value ...]           RL training (PPO, GRPO, RLOO, REINFORCE++, ReMax)
megarl sft CONFIG [key=value ...]             supervised fine-tuning, writes an HF checkpoint
megarl dpo|ipo|kto|orpo|simpo CONFIG [...]    offline preference training, writes an HF checkpoint
megarl data make TASK --out DIR               a locally generated verifiable task, in verl's schema
megarl quickstart [--out DIR]                 tiny model -> SFT warm-start -> GRPO, on 2 CPU processes
megarl parity-check [--out DIR]               Megatron vs transformers at 4 layouts, checkpoint round trip
megarl report RUN_DIR [RUN_DIR ...] [--out DIR]  plots + report.md of a run; several runs: overlaid
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input found before any process starts; the message says how to fix it."""


def _check_launch(
    hf: str, tp: int, pp: int, vpp: int | None, nproc: int, sequence_parallel: bool = False
) -> None:
    """Reject impossible conversions/verifications before torchrun starts any rank."""
    from megarl.config.errors import ConfigError
    from megarl.config.parallel_checks import check_layout_vs_model, read_model_dims
    from megarl.config.schema import ParallelConfig
    from megarl.distributed.layout import LayoutKeys, ParallelLayout
    from megarl.models.from_hf import ModelArchitecture

    if not (Path(hf) / "config.json").is_file():
        raise UsageError(f"--hf {hf}: no config.json there; point it at a Hugging Face checkpoint directory")
    parallel = ParallelConfig(tp=tp, pp=pp, vpp=vpp, sequence_parallel=sequence_parallel)
    flags = LayoutKeys(flags=True)  # problem lines name --tp, --pp, ... as typed
    problems = ParallelLayout.check(parallel, nproc, flags, world=f"--nproc={nproc}")
    ModelArchitecture.from_pretrained(hf)  # names an unsupported architecture before anything else
    try:
        dims = read_model_dims(hf)
    except (KeyError, ValueError, TypeError) as e:
        raise UsageError(f"--hf {hf}: config.json is malformed ({type(e).__name__}: {e})") from None
    check_layout_vs_model(flags, parallel, dims, problems)
    if problems:
        raise UsageError(str(ConfigError(problems)).replace("invalid megarl config", "invalid layout"))


def _launch(program: str, argv: list[str], nproc: int) -> dict:
    from megarl.distributed.rank_program import launch_rank_program

    result = launch_rank_program(program, argv, nproc)
    if result.returncode != 0 and not result.results:
        raise UsageError(f"{program} failed on {nproc} rank(s):\n{result.failure_summary()}")
    return {"returncode": result.returncode, "results": result.results}


def cmd_config_show(args: argparse.Namespace) -> int:
    from megarl.config import config_to_yaml, load_config

    print(
        config_to_yaml(load_config(args.config, args.overrides, check_paths=not args.no_check_paths)), end=""
    )
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    from megarl.models.tiny import build_tiny_hf

    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    print(build_tiny_hf(args.out, family=args.family, seed=args.seed, **overrides))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    program = "megarl.models.convert.rank_convert"
    if Path(args.out).exists() and not args.overwrite:
        raise UsageError(
            f"--out {args.out} already exists; remove it, choose another --out or pass --overwrite"
        )
    if args.direction == "mcore-to-hf":
        return _mcore_to_hf(args)
    _check_launch(args.hf, args.tp, args.pp, args.vpp, args.tp * args.pp)
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
    ]
    worker_args += ["--vpp", str(args.vpp)] if args.vpp else []
    worker_args += ["--dtype", args.dtype] if args.dtype else []
    worker_args += ["--overwrite"] if args.overwrite else []
    outcome = _launch(program, worker_args, args.tp * args.pp)
    for result in outcome["results"]:
        print(json.dumps(result))
    return outcome["returncode"]


def _mcore_to_hf(args: argparse.Namespace) -> int:
    """In this process: the export reads the dist-checkpoint layer by layer without megatron or ranks."""
    from megarl.models.convert.export import export_checkpoint_hf
    from megarl.models.convert.mcore_checkpoint import read_meta
    from megarl.models.convert.run_checkpoints import resolve_role_checkpoint
    from megarl.models.convert.safetensors_shards import parse_size

    try:
        max_shard_bytes = parse_size(args.max_shard_size)
    except ValueError as e:
        raise UsageError(f"--max-shard-size: {e}") from None
    ckpt = resolve_role_checkpoint(args.ckpt, args.role)
    read_meta(ckpt)
    print(json.dumps(export_checkpoint_hf(ckpt, args.out, max_shard_bytes, overwrite=args.overwrite)))
    return 0


def cmd_verify_model(args: argparse.Namespace) -> int:
    nproc = args.nproc or args.tp * args.pp
    _check_launch(args.hf, args.tp, args.pp, args.vpp, nproc, args.sequence_parallel)
    layout = (
        f"tp{args.tp}pp{args.pp}"
        + (f"vpp{args.vpp}" if args.vpp else "")
        + ("sp" if args.sequence_parallel else "")
    )
    worker_args = ["--hf", args.hf, "--layouts", layout, "--tolerance", str(args.tolerance)]
    outcome = _launch("megarl.models.verify", worker_args, nproc)
    for r in outcome["results"]:
        if args.json:
            print(json.dumps(r))
        else:
            verdict = "OK" if r["passed"] else "FAILED"
            print(
                f"{verdict} {r['family']} {r['layout']}: max|Δlogits|={r['max_abs_logit_diff']:.2e} "
                f"(tolerance {r['tolerance']:.0e}), |Δloss|={r['loss_abs_diff']:.2e}, "
                f"max|Δgrad|={r['max_abs_grad_diff']:.2e}, grad-norm rel. diff={r['grad_norm_rel_diff']:.2e}"
            )
    return 0 if outcome["results"] and all(r["passed"] for r in outcome["results"]) else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from megarl.bench import dispatch

    print(json.dumps(dispatch.run(Path(args.out), args.repeats), indent=2))
    return 0


def cmd_bench_microbatch(args: argparse.Namespace) -> int:
    from megarl.bench import microbatch

    print(json.dumps(microbatch.run(args), indent=2))
    return 0


def cmd_bench_reshard(args: argparse.Namespace) -> int:
    from megarl.bench import reshard

    result = reshard.run(args)
    print(json.dumps(result, indent=2) if args.json else reshard.summarize(result))
    return 0


# the comparative suites: each module has add_arguments(parser), run(args) -> result, table(result)
TABLE_SUITES = {
    "e2e": "a GRPO step, megarl vs TRL's GRPOTrainer, same machine and run",
    "scaling": "megarl's step time as model, prompts and length grow",
    "train": "policy update: Megatron vs transformers eager, same batch",
    "rollout": "vLLM in the trainer after a weight sync vs a standalone engine",
}


def cmd_bench_suite(args: argparse.Namespace) -> int:
    import importlib

    suite = importlib.import_module(f"megarl.bench.{args.what}")
    print(suite.table(suite.run(args)))
    return 0


def cmd_bench_checkpoint(args: argparse.Namespace) -> int:
    from megarl.bench import checkpoint

    result = checkpoint.run(args)
    print(json.dumps(result, indent=2) if args.json else checkpoint.summarize(result))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from megarl.train import run

    return run(args.config, args.overrides, job=args.command)


def cmd_data_make(args: argparse.Namespace) -> int:
    from megarl.data.tasks import make_task
    from megarl.observe.progress import task

    what = (
        f"making {args.task}: {args.n_train} train, {args.n_val} val, {args.n_sft} sft, "
        f"{args.n_pref} preference and kto examples"
    )
    with task(what, stream=sys.stderr):  # stdout stays the list of files
        files = make_task(
            args.task,
            args.out,
            args.n_train,
            args.n_val,
            args.n_sft,
            seed=args.seed,
            n_pref=args.n_pref,
            sft_noise=args.sft_noise,
        )
    for split in ("train", "val", "sft", "preference", "kto"):
        print(f"{split:10s} {getattr(files, split)}")
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from megarl.quickstart import run_quickstart

    return run_quickstart(Path(args.out), seed=args.seed, grpo_steps=args.grpo_steps)


def cmd_parity_check(args: argparse.Namespace) -> int:
    from megarl.parity_check import run_parity_check

    return run_parity_check(Path(args.out))


def cmd_report(args: argparse.Namespace) -> int:
    from megarl.observe.report import describe, write_report

    print(describe(write_report([Path(d) for d in args.run_dirs], Path(args.out) if args.out else None)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from megarl.models.dtypes import DTYPE_NAMES

    parser = argparse.ArgumentParser(prog="megarl", description="Megatron-native RL post-training for LLMs")
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="inspect configs").add_subparsers(dest="action", required=True)
    show = config.add_parser("show", help="print the resolved config or the validation problems")
    show.add_argument("config", help="YAML file (e.g. configs/quickstart_grpo.yaml)")
    show.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.parallel.tp=2")
    show.add_argument("--no-check-paths", action="store_true", help="skip checks that need model/data files")
    show.set_defaults(func=cmd_config_show)

    tiny = sub.add_parser("tiny-model", help="build a tiny random HF model + tokenizer offline")
    tiny.add_argument("--out", required=True)
    tiny.add_argument("--family", default="llama", choices=["llama", "mistral", "qwen2", "qwen3"])
    tiny.add_argument("--layers", type=int, default=None)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=cmd_tiny_model)

    convert = sub.add_parser("convert", help="HF <-> megatron checkpoints").add_subparsers(
        dest="direction", required=True
    )
    to_mcore = convert.add_parser("hf-to-mcore", help="HF safetensors -> megarl megatron dist-checkpoint")
    to_mcore.add_argument("--hf", required=True)
    to_mcore.add_argument("--out", required=True)
    to_mcore.add_argument("--tp", type=int, default=1)
    to_mcore.add_argument("--pp", type=int, default=1)
    to_mcore.add_argument("--vpp", type=int, default=None)
    to_mcore.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="default: the HF dtype")
    to_mcore.add_argument("--overwrite", action="store_true")
    to_mcore.set_defaults(func=cmd_convert)
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
    to_hf.add_argument("--overwrite", action="store_true")
    to_hf.set_defaults(func=cmd_convert)

    verify = sub.add_parser(
        "verify-model", help="compare megatron logits/grads with transformers at a layout"
    )
    verify.add_argument("--hf", required=True)
    verify.add_argument("--tp", type=int, default=1)
    verify.add_argument("--pp", type=int, default=1)
    verify.add_argument("--vpp", type=int, default=None)
    verify.add_argument("--sequence-parallel", action="store_true")
    verify.add_argument("--nproc", type=int, default=None, help="ranks to launch (default tp*pp; more = DP)")
    verify.add_argument("--tolerance", type=float, default=5e-5, help="max |Δlogits| allowed (fp32)")
    verify.add_argument("--json", action="store_true", help="print one JSON line per layout")
    verify.set_defaults(func=cmd_verify_model)

    bench = sub.add_parser("bench", help="benchmarks that write JSON").add_subparsers(
        dest="what", required=True
    )
    bench_dispatch = bench.add_parser("dispatch", help="driver->group round trip, Ray vs SPMD")
    bench_dispatch.add_argument("--out", default="outputs/bench/dispatch.json")
    bench_dispatch.add_argument("--repeats", type=int, default=5)
    bench_dispatch.set_defaults(func=cmd_bench)
    bench_microbatch = bench.add_parser("microbatch", help="policy worker: padded vs packed micro-batches")
    from megarl.bench.microbatch import add_arguments as microbatch_arguments

    microbatch_arguments(bench_microbatch)
    bench_microbatch.set_defaults(func=cmd_bench_microbatch)
    bench_reshard = bench.add_parser("reshard", help="3D-HybridEngine transition: bytes, floor, time, memory")
    from megarl.bench.reshard import add_arguments as reshard_arguments

    reshard_arguments(bench_reshard)
    bench_reshard.set_defaults(func=cmd_bench_reshard)
    import importlib

    for name, text in TABLE_SUITES.items():
        suite_parser = bench.add_parser(name, help=text)
        importlib.import_module(f"megarl.bench.{name}").add_arguments(suite_parser)
        suite_parser.set_defaults(func=cmd_bench_suite)
    bench_checkpoint = bench.add_parser(
        "checkpoint", help="a trained role's checkpoint: save/load time, size"
    )
    from megarl.bench.checkpoint import add_arguments as checkpoint_arguments

    checkpoint_arguments(bench_checkpoint)
    bench_checkpoint.set_defaults(func=cmd_bench_checkpoint)

    from megarl.config.validate_algorithm import PREFERENCE_ALGORITHMS

    jobs = [("train", "RL training"), ("sft", "supervised fine-tuning")]
    jobs += [(name, f"offline preference training with {name.upper()}") for name in PREFERENCE_ALGORITHMS]
    for name, what in jobs:
        job = sub.add_parser(name, help=f"{what} from a YAML config")
        job.add_argument("config", help="YAML file (e.g. configs/quickstart_grpo.yaml)")
        job.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.n=8")
        job.set_defaults(func=cmd_train)

    from megarl.data.tasks import TASKS

    data = sub.add_parser("data", help="datasets").add_subparsers(dest="action", required=True)
    make = data.add_parser("make", help="write a locally generated verifiable task as parquet")
    make.add_argument("task", choices=TASKS)
    make.add_argument("--out", required=True)
    make.add_argument("--n-train", type=int, default=2048)
    make.add_argument("--n-val", type=int, default=128)
    make.add_argument("--n-sft", type=int, default=2048)
    make.add_argument(
        "--n-pref", type=int, default=1024, help="rows of preference.parquet and of kto.parquet"
    )
    make.add_argument("--seed", type=int, default=0)
    make.add_argument(
        "--sft-noise", type=float, default=0.0, help="fraction of SFT answers that copy the input (wrong)"
    )
    make.set_defaults(func=cmd_data_make)

    quick = sub.add_parser("quickstart", help="tiny model -> SFT warm-start -> GRPO on 2 CPU processes")
    quick.add_argument("--out", default="outputs/quickstart")
    quick.add_argument("--seed", type=int, default=0, help="seed of the model, data, SFT and GRPO")
    quick.add_argument("--grpo-steps", type=int, default=None, help="default: the config's")
    quick.set_defaults(func=cmd_quickstart)

    parity = sub.add_parser("parity-check", help="Megatron vs transformers at 4 layouts, round trip")
    parity.add_argument("--out", default="outputs/parity_check")
    parity.set_defaults(func=cmd_parity_check)

    report = sub.add_parser("report", help="PNG plots and report.md of a run; several runs: overlaid")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's trainer.output_dir")
    report.add_argument(
        "--out", default=None, help="default: RUN_DIR/report, or FIRST_RUN/report/compare for several runs"
    )
    report.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    from megarl.observe.worker_logs import quiet_known_warnings

    quiet_known_warnings()  # before megatron is imported (its CPU-fallback notices)
    from megarl.config.errors import ConfigError
    from megarl.models.convert.mcore_checkpoint import CheckpointError
    from megarl.models.from_hf import UnsupportedModelError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops filling a positional list at the first flag: `show CFG --no-check-paths a=1`.
    if (
        extra
        and getattr(args, "overrides", None) is not None
        and all("=" in e and not e.startswith("-") for e in extra)
    ):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except (UsageError, ConfigError, CheckpointError, UnsupportedModelError, FileNotFoundError) as e:
        print(f"megarl {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
