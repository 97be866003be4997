"""`megarl quickstart [--out DIR] [KEY=VALUE ...]`: tiny model -> SFT warm-start -> GRPO, on 2 CPU
processes (`actor.backend=fsdp`: both on the FSDP backend)."""

from __future__ import annotations

import argparse
from pathlib import Path

from megarl.cli.model import TINY_FAMILY_NAMES


def register(commands: argparse._SubParsersAction) -> None:
    quick = commands.add_parser("quickstart", help="tiny model -> SFT warm-start -> GRPO on 2 CPU processes")
    quick.add_argument("--out", default="outputs/quickstart")
    quick.add_argument("--seed", type=int, default=0, help="seed of the model, data, SFT and GRPO")
    quick.add_argument("--grpo-steps", type=int, default=None, help="default: the config's")
    quick.add_argument(
        "--family",
        default="llama",
        choices=TINY_FAMILY_NAMES,
        help="the tiny model's architecture (phi3 and gemma2 train on actor.backend=fsdp)",
    )
    quick.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides for both the SFT and the GRPO run, e.g. actor.backend=fsdp",
    )
    quick.set_defaults(func=quickstart)


def quickstart(args: argparse.Namespace) -> int:
    from megarl.quickstart import run_quickstart

    return run_quickstart(
        Path(args.out),
        seed=args.seed,
        grpo_steps=args.grpo_steps,
        overrides=args.overrides,
        family=args.family,
    )
