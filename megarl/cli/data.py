"""`megarl data make TASK --out DIR`: a locally generated verifiable task, in verl's schema."""

from __future__ import annotations

import argparse
import sys


def register(commands: argparse._SubParsersAction) -> None:
    from megarl.data.tasks import TASKS

    data = commands.add_parser("data", help="datasets").add_subparsers(dest="action", required=True)
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
    make.add_argument(
        "--tool-share",
        type=float,
        default=None,
        help="calc_tool: fraction of SFT traces that call the calculator (default 0.5)",
    )
    make.set_defaults(func=make_data)


def make_data(args: argparse.Namespace) -> int:
    from megarl.data.tasks import CALC_TOOL, make_task
    from megarl.observe.progress import task

    what = f"making {args.task}: {args.n_train} train, {args.n_val} val, {args.n_sft} sft"
    what += " traces" if args.task == CALC_TOOL else f", {args.n_pref} preference and kto examples"
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
            tool_share=args.tool_share,
        )
    for split in ("train", "val", "sft", "preference", "kto"):
        if getattr(files, split) is not None:
            print(f"{split:10s} {getattr(files, split)}")
    return 0
