"""`trainer.launcher=torchrun` on one node: megarl starts torchrun itself and, when the job fails,
says which rank died or hung and what the others were doing (from their status files)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from megarl.controller.rank_status import STATUS_DIR
from megarl.errors import EXIT_PREEMPTED, EXIT_USAGE

if TYPE_CHECKING:
    from megarl.config.schema import MegarlConfig


SUPERVISED = "MEGARL_TORCHRUN_SUPERVISED"


def under_torchrun() -> bool:
    """This process is a rank that torchrun (or srun with torchrun's variables) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def relaunch_with_torchrun(cfg: MegarlConfig, argv: list[str]) -> int:
    """Start `torchrun -m megarl.train argv` on this node with one process per configured device; when
    it fails, say which rank died or hung and what the others were doing (from their status files)."""
    from megarl.distributed.launch import TORCHRUN_SIGNALS, free_port

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
        "megarl.distributed.store",  # torchrun, its store on --master_addr only
        f"--nproc_per_node={t.n_devices_per_node}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        f"--signals-to-handle={TORCHRUN_SIGNALS}",
        # after a stop signal the ranks finish their step (trainer.preempt_grace_s) and save (one call)
        f"--shutdown-timeout={int(t.preempt_grace_s + t.worker_timeout_s)}",
        "-m",
        "megarl.train",
        *argv,
    ]
    return supervise_torchrun(cmd, Path(t.output_dir) / STATUS_DIR, t.worker_timeout_s, t.resume)


def supervise_torchrun(
    cmd: list[str], status_dir: Path, timeout_s: float | None = None, resume: str = "auto"
) -> int:
    """Run the torchrun command `cmd` whose ranks keep status files in `status_dir` (in the run's
    output_dir); on failure print the post-mortem, ending with what a rerun with trainer.resume=`resume`
    does. Returns the exit code."""
    from megarl.checkpoint.run import resume_advice
    from megarl.controller.rank_status import post_mortem, read_statuses
    from megarl.distributed.launch import supervise

    shutil.rmtree(status_dir, ignore_errors=True)  # a previous run's files would mislead the post-mortem
    try:
        # SUPERVISED: the ranks leave the one line a stop signal ends the run with to this process
        job = supervise(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1", SUPERVISED: "1"})
    except KeyboardInterrupt:  # torchrun got the signal too and stops its ranks
        print("megarl: interrupted", file=sys.stderr)
        return 130
    statuses = read_statuses(status_dir)
    if job.returncode != 0 and statuses and all(s.get("state") == "preempted" for s in statuses):
        # every rank stopped for a stop signal (rank 0's line says how; torchrun's own report is not shown)
        print(f"megarl train: {statuses[0].get('error')}", file=sys.stderr)
        return EXIT_PREEMPTED
    returncode = job.returncode
    if returncode == 0 and any(s.get("state") != "done" for s in statuses):
        returncode = 1  # a rank failed or died although torchrun reported success (seen when a rank
        # exits with its error before torchrun notices that a peer was killed)
    if returncode != 0:
        advice = resume_advice(status_dir.parent, resume)
        message = post_mortem(status_dir, returncode, job.output_tail, timeout_s, advice)
        if job.leftovers:
            message += (
                f"\nstopped {len(job.leftovers)} process(es) the job left behind: {', '.join(job.leftovers)}"
            )
        if job.signal_name:
            message = f"stopped by {job.signal_name}, but not every rank stopped cleanly: {message}"
        print(f"megarl train: {message}", file=sys.stderr)
    return returncode
