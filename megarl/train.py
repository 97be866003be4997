"""Run the RL trainer (or SFT) from a config: `megarl train` / `megarl sft`, and the torchrun entry.

    megarl train configs/quickstart_grpo.yaml rollout.n=8                   # trainer.launcher=ray (default)
    torchrun --nproc_per_node 2 -m megarl.train CONFIG trainer.launcher=torchrun ...   # SPMD, no Ray
    megarl train CONFIG trainer.launcher=torchrun     # the same: megarl starts torchrun on this node

Every config problem is reported before any process starts (exit 2). Ctrl-C stops every worker.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

EXIT_USAGE = 2


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _relaunch_with_torchrun(cfg, argv: list[str]) -> int:
    """Start `torchrun -m megarl.train argv` on this node with one process per configured device."""
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
    try:
        return subprocess.call(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except KeyboardInterrupt:  # torchrun got the signal too and stops its ranks
        print("megarl: interrupted", file=sys.stderr)
        return 130


def run(config: str, overrides: list[str], sft: bool = False) -> int:
    """Load and check the config, then train; returns the exit code."""
    from megarl.config import load_config
    from megarl.config.errors import ConfigError
    from megarl.controller.resource_pool import ResourcePoolError
    from megarl.controller.worker import WorkerError
    from megarl.data.files import DataError
    from megarl.models.convert.mcore_checkpoint import CheckpointError
    from megarl.rewards.custom import RewardError
    from megarl.trainer.checkpoint import ResumeError
    from megarl.trainer.dataflow import DataflowError
    from megarl.trainer.rl_stages import DynamicSamplingError

    argv = [config, *overrides] + (["--sft"] if sft else [])
    try:
        cfg = load_config(config, ["algorithm.name=sft", *overrides] if sft else overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"megarl {'sft' if sft else 'train'}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if cfg.trainer.launcher == "torchrun" and not _under_torchrun():
        return _relaunch_with_torchrun(cfg, argv)
    if cfg.trainer.launcher == "ray" and _under_torchrun():
        print("megarl: this process runs under torchrun; set trainer.launcher=torchrun", file=sys.stderr)
        return EXIT_USAGE
    try:
        if sft:
            from megarl.trainer.sft import SFTTrainer

            SFTTrainer(cfg).fit()
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
        print(f"megarl {'sft' if sft else 'train'}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (WorkerError, DynamicSamplingError) as e:  # every worker process is already stopped
        print(f"megarl {'sft' if sft else 'train'}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("megarl: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megarl.train")
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--sft", action="store_true", help="supervised fine-tuning instead of RL")
    args = parser.parse_args(argv)
    return run(args.config, args.overrides, sft=args.sft)


if __name__ == "__main__":
    sys.exit(main())
