"""`megarl config show CONFIG [key=value ...]`: the resolved config, or every validation problem (exit 2)."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser("config", help="inspect configs").add_subparsers(
        dest="action", required=True
    )
    show = config.add_parser("show", help="print the resolved config or the validation problems")
    show.add_argument("config", help="YAML file (e.g. configs/quickstart_grpo.yaml)")
    show.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.parallel.tp=2")
    show.add_argument(
        "--no-check-paths",
        action="store_true",
        help="skip checks that need model/data files or this machine's devices",
    )
    show.set_defaults(func=show_config)


def show_config(args: argparse.Namespace) -> int:
    from megarl.config import config_to_yaml, load_config

    print(
        config_to_yaml(load_config(args.config, args.overrides, check_paths=not args.no_check_paths)), end=""
    )
    return 0
