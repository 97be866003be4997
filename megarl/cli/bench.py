"""`megarl bench WHAT`: benchmarks that write JSON, each against a peer or a floor."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

# the comparative suites: each module has add_arguments(parser), run(args) -> result, table(result)
TABLE_SUITES = {
    "e2e": "a GRPO step, megarl vs TRL's GRPOTrainer, same machine and run",
    "scaling": "megarl's step time as model, prompts and length grow",
    "train": "policy update: Megatron vs transformers eager (--backend fsdp: and FSDP), same batch",
    "rollout": "vLLM in the trainer after a weight sync vs a standalone engine",
    "reward": "the reward stage per row: contained in reward workers vs called in the driver",
    "async": "colocated vs separate engines at max_staleness 0/1/2 and partial rollouts, long-tail lengths",
    "lora": "full fine-tuning vs LoRA: update tokens/s, optimizer state, peak memory, sync bytes and seconds",
    "engine-start": "a compiled vLLM engine's start in a fresh process: empty engine cache vs cached",
    "roofline": "each e2e stage's time over its floor (FLOPs and bytes at the machine's measured rates), MFU",
}
SUITE_MODULES = {"async": "async_training", "engine-start": "engine_start"}  # `async`: a Python keyword


def register(commands: argparse._SubParsersAction) -> None:
    from megarl.bench import checkpoint, microbatch, reshard

    bench = commands.add_parser("bench", help="benchmarks that write JSON").add_subparsers(
        dest="what", required=True
    )
    bench_dispatch = bench.add_parser("dispatch", help="driver->group round trip, Ray vs SPMD")
    bench_dispatch.add_argument("--out", default="outputs/bench/dispatch.json")
    bench_dispatch.add_argument("--repeats", type=int, default=5)
    bench_dispatch.set_defaults(func=bench_dispatch_round_trip)
    bench_microbatch = bench.add_parser("microbatch", help="policy worker: padded vs packed micro-batches")
    microbatch.add_arguments(bench_microbatch)
    bench_microbatch.set_defaults(func=bench_microbatches)
    bench_reshard = bench.add_parser("reshard", help="3D-HybridEngine transition: bytes, floor, time, memory")
    reshard.add_arguments(bench_reshard)
    bench_reshard.set_defaults(func=bench_reshard_transition)
    for name, text in TABLE_SUITES.items():
        suite_parser = bench.add_parser(name, help=text)
        importlib.import_module(f"megarl.bench.{SUITE_MODULES.get(name, name)}").add_arguments(suite_parser)
        suite_parser.set_defaults(func=bench_suite)
    bench_checkpoint = bench.add_parser(
        "checkpoint", help="a trained role's checkpoint: save/load time, size"
    )
    checkpoint.add_arguments(bench_checkpoint)
    bench_checkpoint.set_defaults(func=bench_checkpoints)


def bench_dispatch_round_trip(args: argparse.Namespace) -> int:
    from megarl.bench import dispatch

    print(json.dumps(dispatch.run(Path(args.out), args.repeats), indent=2))
    return 0


def bench_microbatches(args: argparse.Namespace) -> int:
    from megarl.bench import microbatch

    print(json.dumps(microbatch.run(args), indent=2))
    return 0


def bench_reshard_transition(args: argparse.Namespace) -> int:
    from megarl.bench import reshard

    result = reshard.run(args)
    print(json.dumps(result, indent=2) if args.json else reshard.summarize(result))
    return 0


def bench_suite(args: argparse.Namespace) -> int:
    suite = importlib.import_module(f"megarl.bench.{SUITE_MODULES.get(args.what, args.what)}")
    print(suite.table(suite.run(args)))
    return 0


def bench_checkpoints(args: argparse.Namespace) -> int:
    from megarl.bench import checkpoint

    result = checkpoint.run(args)
    print(json.dumps(result, indent=2) if args.json else checkpoint.summarize(result))
    return 0
