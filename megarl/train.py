"""Run a trainer from a config: `megarl train` (RL), `megarl sft`, `megarl dpo|ipo|kto|orpo|simpo`
(preference training), and the torchrun entry.

    megarl train configs/quickstart_grpo.yaml rollout.n=8                   # trainer.launcher=ray (default)
    torchrun --nproc_per_node 2 -m megarl.train CONFIG trainer.launcher=torchrun ...   # SPMD, no Ray
    megarl train CONFIG trainer.launcher=torchrun     # the same: megarl starts torchrun on this node

Every config problem is reported before any process starts (exit 2). Ctrl-C stops every worker.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from megarl.controller.rank_status import STATUS_DIR

EXIT_USAGE = 2


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _relaunch_with_torchrun(cfg, argv: list[str]) -> int:
    """Start `torchrun -m megarl.train argv` on this node with one process per configured device; when
    it fails, say which rank died or hung and what the others were doing (from their status files)."""
    from megarl.distributed.launch import free_port

    t = cfg.trainer
    if t.nnodes != 1:
        print(
            f"megarl: trainer.launcher=torchrun with trainer.nnodes={t.nnodes}: start torchrun (or srun) on every "
            "node yourself: torchrun --nnodes N --nproc_per_node M --rdzv_endpoint HOST:PORT -m megarl.train ...",
            file=sys.stderr,
        )
        return EXIT_USAGE
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={t.n_devices_per_node}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "megarl.train",
        *argv,
    ]
    return supervise_torchrun(cmd, Path(t.output_dir) / STATUS_DIR, t.worker_timeout_s)


def supervise_torchrun(cmd: list[str], status_dir: Path, timeout_s: float | None = None) -> int:
    """Run the torchrun command `cmd` whose ranks keep status files in `status_dir`; on failure print
    the post-mortem. Returns the exit code."""
    from megarl.controller.rank_status import post_mortem, read_statuses
    from megarl.distributed.launch import supervise

    shutil.rmtree(status_dir, ignore_errors=True)  # a previous run's files would mislead the post-mortem
    try:
        job = supervise(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except KeyboardInterrupt:  # torchrun got the signal too and stops its ranks
        print("megarl: interrupted", file=sys.stderr)
        return 130
    returncode = job.returncode
    if returncode == 0 and any(s.get("state") != "done" for s in read_statuses(status_dir)):
        returncode = 1  # a rank failed or died although torchrun reported success (seen when a rank
        # exits with its error before torchrun notices that a peer was killed)
    if returncode != 0:
        message = post_mortem(status_dir, returncode, job.output_tail, timeout_s)
        if job.leftovers:
            message += (
                f"\nstopped {len(job.leftovers)} process(es) the job left behind: {', '.join(job.leftovers)}"
            )
        print(f"megarl train: {message}", file=sys.stderr)
    return returncode


JOBS = ("train", "sft", "dpo", "ipo", "kto", "orpo", "simpo")  # `train` = RL; the others set algorithm.name


def run(config: str, overrides: list[str], job: str = "train") -> int:
    """Load and check the config, then run `job` (one of JOBS); returns the exit code."""
    from megarl.config import load_config
    from megarl.config.errors import ConfigError
    from megarl.config.validate_algorithm import RL_ALGORITHMS
    from megarl.controller import faults
    from megarl.controller.rank_status import RANK_STATUS
    from megarl.controller.resource_pool import ResourcePoolError
    from megarl.controller.worker import WorkerError
    from megarl.data.files import DataError
    from megarl.models.convert.mcore_checkpoint import CheckpointError
    from megarl.observe.worker_logs import console_errors, rank_output_to_log
    from megarl.rewards.custom import RewardError
    from megarl.trainer.bad_steps import BadStepsError
    from megarl.trainer.checkpoint import ResumeError
    from megarl.trainer.dataflow import DataflowError
    from megarl.trainer.rl_stages import DynamicSamplingError

    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; use one of {', '.join(JOBS)}")
    argv = [config, *overrides, "--job", job]
    try:
        cfg = load_config(config, overrides if job == "train" else [f"algorithm.name={job}", *overrides])
        faults.active()  # a bad MEGARL_FAULT fails here, not inside a worker
    except (ConfigError, FileNotFoundError, faults.FaultSpecError) as e:
        print(f"megarl {job}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if job == "train" and cfg.algorithm.name not in RL_ALGORITHMS:
        name = cfg.algorithm.name
        print(
            f"megarl train: error: algorithm.name={name} is not RL training; run `megarl {name} {config}`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if cfg.trainer.launcher == "torchrun" and not _under_torchrun():
        return _relaunch_with_torchrun(cfg, argv)
    if cfg.trainer.launcher == "ray" and _under_torchrun():
        print("megarl: this process runs under torchrun; set trainer.launcher=torchrun", file=sys.stderr)
        return EXIT_USAGE
    if cfg.trainer.launcher == "torchrun":  # read by the post-mortem when the job fails
        RANK_STATUS.open(Path(cfg.trainer.output_dir) / STATUS_DIR, int(os.environ["RANK"]))
        rank_output_to_log(cfg.trainer.output_dir, int(os.environ["RANK"]))
    try:
        if job == "sft":
            from megarl.trainer.sft import SFTTrainer

            SFTTrainer(cfg).fit()
        elif job != "train":
            from megarl.trainer.preference import PreferenceTrainer

            PreferenceTrainer(cfg).fit()
        else:
            from megarl.trainer.rl_trainer import RLTrainer

            RLTrainer(cfg).fit()
    except (
        DataError,
        RewardError,
        DataflowError,
        ResourcePoolError,
        ResumeError,
        CheckpointError,
        OSError,
    ) as e:
        RANK_STATUS.finish(e)
        print(f"megarl {job}: error: {e}", file=console_errors())
        return EXIT_USAGE
    except (WorkerError, DynamicSamplingError, BadStepsError) as e:  # every worker process is already stopped
        RANK_STATUS.finish(e)
        print(f"megarl {job}: {e}", file=console_errors())
        return 1
    except KeyboardInterrupt as e:
        RANK_STATUS.finish(e)
        print("megarl: interrupted; every worker was stopped", file=console_errors())
        return 130
    except BaseException as e:
        RANK_STATUS.finish(e)
        raise
    RANK_STATUS.finish()
    return 0


def main(argv: list[str] | None = None) -> int:
    from megarl.observe.worker_logs import quiet_known_warnings

    quiet_known_warnings()  # before megatron is imported (its CPU-fallback notices)
    parser = argparse.ArgumentParser(prog="python -m megarl.train")
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--job", choices=JOBS, default="train", help="what to run (default: RL training)")
    args = parser.parse_args(argv)
    return run(args.config, args.overrides, job=args.job)


if __name__ == "__main__":
    sys.exit(main())
