"""A tiny SPMD job for test_faults: `launch` runs it under torchrun the way `megarl train` does (status
files, post-mortem, orphans ended); `rank` is one rank: an EchoWorker group called twice, with whatever
MEGARL_FAULT says. Before the calls every rank starts a multiprocessing Manager (spawn), as megatron's
checkpoint save does, and writes its pid, so the test can check none outlives the job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TIMEOUT_S = 5.0


def rank_main(directory: Path) -> int:
    import multiprocessing

    import torch

    from megarl.controller.group import make_worker_group
    from megarl.controller.rank_status import RANK_STATUS, STATUS_DIR
    from megarl.protocol import Batch
    from tests.helpers.workers import EchoWorker

    rank = int(os.environ["RANK"])
    RANK_STATUS.open(directory / STATUS_DIR, rank)
    manager = multiprocessing.get_context("spawn").Manager()
    (directory / f"helper_{rank}.json").write_text(json.dumps([manager._process.pid]))
    try:
        group = make_worker_group("spmd", None, EchoWorker, "flat", {}, call_timeout_s=TIMEOUT_S)
        for _ in range(2):
            group.double(Batch(tensors={"x": torch.arange(4)}))
    except BaseException as e:
        RANK_STATUS.finish(e)
        print(f"rank {rank}: {e}", file=sys.stderr)
        return 1
    RANK_STATUS.finish()
    return 0


def launch(directory: Path) -> int:
    from megarl.cli.torchrun import supervise_torchrun
    from megarl.distributed.launch import free_port

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "tests.multiproc.fault_job",
        "rank",
        str(directory),
    ]
    return supervise_torchrun(cmd, directory / "status", TIMEOUT_S)


if __name__ == "__main__":
    mode, directory = sys.argv[1], Path(sys.argv[2])
    sys.exit(rank_main(directory) if mode == "rank" else launch(directory))
