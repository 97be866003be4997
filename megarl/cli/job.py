"""The job runner: load and check a config, run its trainer, and end with the exit code the outcome
calls for. It serves these commands, and every rank of the torchrun entry (`-m megarl.train`):

megarl train [CONFIG] [key=value ...]         RL training (PPO, GRPO, RLOO, REINFORCE++, ReMax);
                                              verl's keys too: `megarl train key=value ...` runs a verl
                                              script's overrides
megarl sft CONFIG [key=value ...]             supervised fine-tuning, writes an HF checkpoint
megarl dpo|ipo|kto|orpo|simpo CONFIG [...]    offline preference training, writes an HF checkpoint
megarl rm CONFIG [key=value ...]              reward-model training on preference pairs (Bradley–Terry),
                                              writes an HF sequence classifier for reward.model_path

    megarl train configs/quickstart_grpo.yaml rollout.n=8                   # trainer.launcher=ray (default)
    torchrun --nproc_per_node 2 -m megarl.train CONFIG trainer.launcher=torchrun ...   # SPMD, no Ray
    megarl train CONFIG trainer.launcher=torchrun     # the same: megarl starts torchrun on this node

Every config problem is reported before any process starts (exit 2). Ctrl-C stops every worker.
SIGTERM or SIGUSR1 (a scheduler's time limit or preemption, scancel, kill) lets the running step finish
within trainer.preempt_grace_s, saves a checkpoint of it, stops every worker and exits 75: the same
command resumes (megarl.distributed.preemption).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from megarl.cli.errors import report_error
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.observe.worker_logs import console, console_errors, quiet_known_warnings, rank_output_to_log

if TYPE_CHECKING:
    from megarl.config.schema import MegarlConfig

# `train` = RL; the others set algorithm.name
JOBS = ("train", "sft", "dpo", "ipo", "kto", "orpo", "simpo", "rm")


def register(commands: argparse._SubParsersAction) -> None:
    from megarl.config.validate_algorithm import PREFERENCE_ALGORITHMS

    jobs = [("train", "RL training"), ("sft", "supervised fine-tuning")]
    jobs += [(name, f"offline preference training with {name.upper()}") for name in PREFERENCE_ALGORITHMS]
    jobs += [
        ("rm", "reward-model training on preference pairs (Bradley–Terry), exported as an HF classifier")
    ]
    for name, what in jobs:
        job = commands.add_parser(name, help=f"{what} from a YAML config")
        job.add_argument(
            "config", nargs="?", help="YAML file (e.g. configs/quickstart_grpo.yaml); none = the defaults"
        )
        job.add_argument("overrides", nargs="*", help="key=value overrides (megarl's or verl's keys)")
        job.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    return run(args.config, args.overrides, job=args.command)


def run(config: str | None, overrides: list[str], job: str = "train") -> int:
    """Load and check the config (a YAML path or None; verl's keys are accepted), then run `job` (one of
    JOBS); returns the exit code."""
    try:
        return _checked_run(config, overrides, job)
    except KeyboardInterrupt:  # Ctrl-C while the inputs are checked (the run's own handler stops workers)
        print(f"megarl {job}: interrupted while checking its inputs; nothing was started", file=sys.stderr)
        return 130


def _checked_run(config: str | None, overrides: list[str], job: str) -> int:
    from megarl.cli.torchrun import relaunch_with_torchrun, under_torchrun
    from megarl.cli.verl_argv import split_config
    from megarl.config import load_config
    from megarl.config.validate_algorithm import RL_ALGORITHMS
    from megarl.controller import faults
    from megarl.trainer.run_lock import handed_to_children, hold_for_job

    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; use one of {', '.join(JOBS)}")
    config, overrides = split_config(config, overrides)
    argv = [*([config] if config else []), *overrides, "--job", job]
    try:
        cfg = load_config(config, overrides if job == "train" else [f"algorithm.name={job}", *overrides])
        faults.active()  # a bad MEGARL_FAULT fails here, not inside a worker
    except (MegarlError, FileNotFoundError) as e:
        return report_error(job, e)
    if job == "train" and cfg.algorithm.name not in RL_ALGORITHMS:
        name = cfg.algorithm.name
        print(
            f"megarl train: error: algorithm.name={name} is not RL training; run `megarl {name} {config or ''}`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if cfg.trainer.launcher == "ray" and under_torchrun():
        print("megarl: this process runs under torchrun; set trainer.launcher=torchrun", file=sys.stderr)
        return EXIT_USAGE
    spmd_rank = int(os.environ["RANK"]) if cfg.trainer.launcher == "torchrun" and under_torchrun() else None
    if cfg.reward.function.path and spmd_rank is None:  # before torchrun or Ray starts anything
        from megarl.rewards.function_check import check_reward_file

        try:
            check_reward_file(cfg.reward.function.path, cfg.reward.function.name)
        except MegarlError as e:
            return report_error(job, e)
    if cfg.rollout.multi_turn.enable and spmd_rank is None:  # the tools, environment or agent files
        from megarl.agentic.checks import check_agentic_files

        try:
            check_agentic_files(cfg.rollout)
        except MegarlError as e:
            return report_error(job, e)
    with contextlib.ExitStack() as held:
        try:  # one run per trainer.output_dir, before anything is written there
            lock = held.enter_context(hold_for_job(cfg.trainer.output_dir, spmd_rank, say=_say))
        except MegarlError as e:
            return report_error(job, e)
        if cfg.trainer.launcher == "torchrun" and spmd_rank is None and lock is not None:
            with handed_to_children(lock):  # the ranks run under this process's lock
                return relaunch_with_torchrun(cfg, argv)
        return _run_job(job, cfg)


def _say(line: str) -> None:
    print(line, file=console(), flush=True)


def _run_job(job: str, cfg: MegarlConfig) -> int:
    """Run `job`'s trainer in this process (the Ray driver, or one torchrun rank); returns the exit code."""
    from megarl.cli.torchrun import SUPERVISED
    from megarl.controller.rank_status import RANK_STATUS, STATUS_DIR
    from megarl.distributed.preemption import PREEMPTION, Preempted, die_with_parent

    if cfg.trainer.launcher == "torchrun":  # read by the post-mortem when the job fails
        die_with_parent()  # a rank never outlives its torchrun (or srun step)
        RANK_STATUS.open(Path(cfg.trainer.output_dir) / STATUS_DIR, int(os.environ["RANK"]))
        rank_output_to_log(cfg.trainer.output_dir, int(os.environ["RANK"]))
    PREEMPTION.install()  # SIGTERM/SIGUSR1: finish the step, save it, stop (exit 75)
    try:
        if job == "sft":
            from megarl.trainer.sft import SFTTrainer

            with SFTTrainer(cfg) as trainer:
                trainer.fit()
        elif job == "rm":
            from megarl.trainer.reward_model import RewardModelTrainer

            with RewardModelTrainer(cfg) as trainer:
                trainer.fit()
        elif job != "train":
            from megarl.trainer.preference import PreferenceTrainer

            with PreferenceTrainer(cfg) as trainer:
                trainer.fit()
        else:
            from megarl.trainer.rl_trainer import RLTrainer

            with RLTrainer(cfg) as trainer:
                trainer.fit()
    except Preempted as e:  # every worker is stopped; one line (rank 0's, or megarl's torchrun supervisor's)
        RANK_STATUS.finish(e)
        if os.environ.get("RANK", "0") == "0" and SUPERVISED not in os.environ:
            print(f"megarl {job}: {e}", file=console_errors())
        return e.exit_code
    except (MegarlError, OSError) as e:  # a failed run's workers are already stopped
        RANK_STATUS.finish(e)
        return report_error(job, e)
    except KeyboardInterrupt as e:
        RANK_STATUS.finish(e)
        print("megarl: interrupted; every worker was stopped", file=console_errors())
        return 130
    except BaseException as e:
        RANK_STATUS.finish(e)
        raise
    finally:
        PREEMPTION.uninstall()
    RANK_STATUS.finish()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry's command line (`python -m megarl.train CONFIG [key=value ...] [--job JOB]`)."""
    quiet_known_warnings()  # before megatron is imported (its CPU-fallback notices)
    parser = argparse.ArgumentParser(prog="python -m megarl.train")
    parser.add_argument("config", nargs="?")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--job", choices=JOBS, default="train", help="what to run (default: RL training)")
    args = parser.parse_args(argv)
    return run(args.config, args.overrides, job=args.job)
