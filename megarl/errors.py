"""`MegarlError`: the root of every error megarl raises on purpose, carrying the exit code of the
`megarl` command it ends. Catch it to handle any of them (`except megarl.MegarlError`)."""

from __future__ import annotations

EXIT_FAILED = 1  # a run that started and failed (the code of any uncaught Python exception)
EXIT_USAGE = 2  # input rejected before training: flags, config, data, checkpoints, the cluster
# stopped by SIGTERM/SIGUSR1 (a scheduler's time limit or preemption, scancel, kill): rerun to resume.
# 75 is sysexits' EX_TEMPFAIL ("try again later"); launch/slurm/*.sbatch requeue the job on it
EXIT_PREEMPTED = 75


class MegarlError(Exception):
    """An error whose message says what went wrong and how to fix it; `megarl` prints the message
    (no traceback) and exits with `exit_code`."""

    exit_code: int = EXIT_FAILED
