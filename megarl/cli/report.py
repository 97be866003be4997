"""`megarl report RUN_DIR [RUN_DIR ...] [--out DIR]`: plots + report.md of a run; several runs: overlaid."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="PNG plots and report.md of a run; several runs: overlaid")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run's trainer.output_dir")
    report.add_argument(
        "--out", default=None, help="default: RUN_DIR/report, or FIRST_RUN/report/compare for several runs"
    )
    report.set_defaults(func=write_run_report)


def write_run_report(args: argparse.Namespace) -> int:
    from megarl.observe.report import describe, write_report

    print(describe(write_report([Path(d) for d in args.run_dirs], Path(args.out) if args.out else None)))
    return 0
