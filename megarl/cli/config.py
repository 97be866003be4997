"""`megarl config show [CONFIG] [key=value ...]`: the resolved config, or every validation problem (exit 2).

verl's override keys are accepted (megarl.config.verl_keys); `--as-megarl` prints what the file and the
overrides set, in megarl's keys: a verl command line becomes a megarl YAML file."""

from __future__ import annotations

import argparse

from megarl.cli.verl_argv import split_config


def register(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser("config", help="inspect configs").add_subparsers(
        dest="action", required=True
    )
    show = config.add_parser("show", help="print the resolved config or the validation problems")
    show.add_argument(
        "config", nargs="?", help="YAML file (e.g. configs/quickstart_grpo.yaml); none = the defaults"
    )
    show.add_argument("overrides", nargs="*", help="key=value overrides (megarl's or verl's keys)")
    show.add_argument(
        "--no-check-paths",
        action="store_true",
        help="skip checks that need model/data files or this machine's devices",
    )
    show.add_argument(
        "--as-megarl",
        action="store_true",
        help="print only what CONFIG and the overrides set, in megarl's keys (verl's translated)",
    )
    show.set_defaults(func=show_config)


def show_config(args: argparse.Namespace) -> int:
    import yaml

    from megarl.config import config_to_yaml, load_config, settings_as_megarl

    path, overrides = split_config(args.config, args.overrides)
    cfg = load_config(path, overrides, check_paths=not args.no_check_paths)
    if args.as_megarl:
        print(yaml.safe_dump(settings_as_megarl(path, overrides), sort_keys=False), end="")
    else:
        print(config_to_yaml(cfg), end="")
    return 0
