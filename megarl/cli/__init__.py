"""`megarl` command line: one entry point, one sub-command per job; each module here registers its
commands' parsers beside their implementation.

megarl config show [CONFIG] [key=value ...]   resolved config, or the validation problems (exit 2);
                                              --as-megarl: what was set, in megarl's keys
megarl tiny-model --out DIR [--family F]      a tiny random HF model + tokenizer, built offline
megarl verify-model --hf DIR --tp N --pp N [--nproc N] [--json]
megarl parity-check [--out DIR]               Megatron vs transformers at 4 layouts, checkpoint round trip
megarl convert hf-to-mcore --hf DIR --out DIR --tp N --pp N
megarl convert mcore-to-hf --ckpt CKPT|STEP|RUN [--role R] --out DIR [--max-shard-size 5GB]
megarl bench WHAT [...]                       benchmarks that write JSON
megarl train [CONFIG] [key=value ...]         RL training (PPO, GRPO, RLOO, REINFORCE++, ReMax)
megarl sft CONFIG [key=value ...]             supervised fine-tuning, writes an HF checkpoint
megarl dpo|ipo|kto|orpo|simpo CONFIG [...]    offline preference training, writes an HF checkpoint
megarl rm CONFIG [key=value ...]              reward-model training on pairs, writes an HF classifier
megarl data make TASK --out DIR               a locally generated verifiable task, in verl's schema
megarl quickstart [--out DIR]                 tiny model -> SFT warm-start -> GRPO, on 2 CPU processes
megarl report RUN_DIR [RUN_DIR ...] [--out DIR]  plots + report.md of a run; several runs: overlaid

Overrides take megarl's keys or verl's (docs/verl-migration.md): a verl script runs with
`python3 -m verl.trainer.main_ppo` replaced by `megarl train`.
Every error ends the command with one line, `megarl COMMAND: error: ...`, and the error's exit code
(2: input rejected, 1: a run that failed).
"""

from __future__ import annotations

import argparse

from megarl.cli import bench, config, convert, data, job, model, quickstart, report
from megarl.cli.errors import report_error
from megarl.cli.verl_argv import drop_hydra_flags
from megarl.errors import MegarlError

COMMANDS = (config, model, convert, bench, job, data, quickstart, report)  # in the order `--help` lists them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megarl", description="Megatron-native RL post-training for LLMs")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `megarl` command line `argv` (default: sys.argv); returns the exit code."""
    from megarl.observe.worker_logs import quiet_known_warnings

    quiet_known_warnings()  # before megatron is imported (its CPU-fallback notices)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    extra = drop_hydra_flags(extra)
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
    except (MegarlError, FileNotFoundError) as e:
        return report_error(args.command, e)
