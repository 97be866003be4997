"""Where worker processes write: `<trainer.output_dir>/logs/<role>_rank<r>.log`, one file per process.

    logs = logs_dir(cfg.trainer.output_dir)
    redirect_output(log_file(logs, "actor", 0))                     # fds 1 and 2 -> the file
    redirect_output(log_file(logs, "actor", 0), keep_console=True)  # torchrun rank 0: megarl's lines
    print("step 3/10 | …", file=console())                         #   still reach the terminal

A file is named for the process: colocated roles share one (actor_rank0.log holds the actor's and the
reference's output; under torchrun every role lives in the rank's process, so actor_rank<r>.log holds
them all). The console keeps megarl's own lines and errors; everything a library prints, C-level
output included, goes to the file.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TextIO

LOGS_DIR = "logs"

_console: TextIO | None = None
_console_errors: TextIO | None = None


def logs_dir(output_dir: str | os.PathLike) -> Path:
    """The run's directory of worker logs."""
    return Path(output_dir) / LOGS_DIR


def log_file(directory: str | os.PathLike, role: str, rank: int) -> Path:
    """The log of rank `rank`'s process whose first role is `role`, in `directory`."""
    return Path(directory) / f"{role}_rank{rank}.log"


def redirect_output(path: str | os.PathLike, keep_console: bool = False) -> None:
    """Send this process's stdout and stderr to `path` (appended), at the file-descriptor level so that
    C-level output (torch, gloo, vLLM's C++ warnings) goes there too. With `keep_console`, `console()`
    and `console_errors()` keep writing where stdout and stderr went before."""
    global _console, _console_errors
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if keep_console and _console is None:
        _console = os.fdopen(os.dup(1), "w", buffering=1)
        _console_errors = os.fdopen(os.dup(2), "w", buffering=1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def rank_output_to_log(output_dir: str | os.PathLike, rank: int) -> None:
    """A torchrun rank (every role in one process): its output to `<output_dir>/logs/actor_rank<r>.log`,
    megarl's own lines and errors still to the console; rank 0's megarl warnings (what loading the data
    skipped) to the console as well, once for the job as under Ray, where the driver prints them."""
    redirect_output(log_file(logs_dir(output_dir), "actor", rank), keep_console=True)
    if rank == 0:
        handler = logging.StreamHandler(console_errors())
        handler.setLevel(logging.WARNING)
        logging.getLogger("megarl").addHandler(handler)


def console() -> TextIO:
    """Where megarl's own lines go: the terminal, also after `redirect_output(..., keep_console=True)`."""
    return _console if _console is not None else sys.stdout


def console_errors() -> TextIO:
    """Where megarl's error messages go: the terminal's stderr, also after a redirect that kept it."""
    return _console_errors if _console_errors is not None else sys.stderr


def quiet_known_warnings() -> None:
    """Ignore third-party warnings known to be harmless here; each entry names its source and why."""
    # megatron-core at import: no Transformer Engine / apex (CPU runs): its torch fallbacks are what we use
    warnings.filterwarnings("ignore", message=r"(Transformer Engine and )?Apex (are|is) not installed")
    # megatron-core's TransformerConfig: its own default cuda_graph_scope="full" triggers the notice
    warnings.filterwarnings("ignore", message=r"full scope is deprecated", category=UserWarning)
    # torch 2.x deprecates the collectives megatron-core's DDP and vLLM call (their code, not ours)
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor|reduce_op)` is deprecated",
        category=FutureWarning,
    )
