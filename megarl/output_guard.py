"""What megarl may write where: an output never over one of its inputs, and `--overwrite` never over a
training run or a trained checkpoint. Pure path logic, checked before anything is written.

    clash = overlap(out, model_path)          # "is", "contains", "lies inside" or None
    run = megarl_run_in(out)                  # the first file or directory that marks a run, or None
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from megarl.errors import EXIT_USAGE, MegarlError

# What a training run or a trained checkpoint holds (megarl.checkpoint.run, .manifest; observe.run_files;
# the run lock): a directory with one of these is never removed by `--overwrite`. A conversion's output
# (megarl_checkpoint.json without a manifest) and an HF export may be.
RUN_MARKERS = (
    "checkpoints",  # a run's checkpoint tree
    "metrics.jsonl",  # a run's step records
    "run_info.json",  # a run's machine and layouts
    "run.lock",  # a run's lock
    "trainer_state.json",  # a step directory
    "latest",  # a run's checkpoints/ directory
    "manifest.json",  # a trained role's checkpoint (written last by every save)
)


class OutputPathError(MegarlError, ValueError):
    """An output path that would overwrite an input or a training run; nothing has been written."""

    exit_code = EXIT_USAGE


def overlap(out: str | os.PathLike, source: str | os.PathLike) -> str | None:
    """How the output path `out` overlaps the input `source` (symlinks resolved): "is", "contains" (the
    input lies inside the output) or "lies inside" (the output lies inside the input); None when apart."""
    a, b = Path(out).resolve(), Path(source).resolve()
    if a == b:
        return "is"
    if a in b.parents:
        return "contains"
    if b in a.parents:
        return "lies inside"
    return None


def check_apart(out: str | os.PathLike, inputs: dict[str, str | os.PathLike | None], flag: str) -> None:
    """OutputPathError when the output `out` is, contains or lies inside one of `inputs` ({what: path})."""
    for what, source in inputs.items():
        if source and (how := overlap(out, source)):
            raise OutputPathError(
                f"{flag} {out} {how} {what} ({source}): writing it would overwrite its own input; choose "
                f"an output that neither is, contains nor lies inside {source}"
            )


def megarl_run_in(path: str | os.PathLike) -> Path | None:
    """The first file or directory under `path` (itself included) that marks a megarl run or a trained
    checkpoint (RUN_MARKERS), or None. Walks the tree the way removing it would."""
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            if name in RUN_MARKERS:
                return Path(root) / name
    return None


def check_replaceable(out: str | os.PathLike, flag: str = "--out") -> None:
    """`out` exists and `--overwrite` was given: it may be replaced only when it is a directory that holds
    no megarl run or trained checkpoint."""
    out = Path(out)
    if not out.is_dir():
        raise OutputPathError(
            f"{flag} {out} is a file, not a directory; --overwrite replaces an earlier export or conversion "
            f"only: remove the file yourself or choose another {flag}"
        )
    found = megarl_run_in(out)
    if found is not None:
        raise OutputPathError(
            f"{flag} {out} holds a megarl training run or checkpoint ({found}); --overwrite never removes one: "
            f"choose another {flag}, or delete {out} yourself if you mean to"
        )


class OutputWriteError(MegarlError, OSError):
    """An output that could not be written: a full disk, a read-only or forbidden location. The message
    names the path (and, for a full disk, the space needed and free); the inputs are not at fault."""

    @classmethod
    def of(
        cls,
        error: OSError,
        path: str | os.PathLike,
        needed_bytes: int | None = None,
        free: int | None = None,
        key: str | None = None,
    ) -> OutputWriteError:
        """`free`: the bytes left on the device (looked up when not given); `key`: the setting that names
        `path` (e.g. "trainer.output_dir"), shown as key=path."""
        path = Path(path)
        if key is not None:
            named = cls.of(error, path, needed_bytes, free)
            named.args = (f"{key}={named}",)
            return named
        if error.errno == errno.ENOSPC:
            free = free if free is not None else free_bytes(path)
            need = f"about {human_bytes(needed_bytes)} needed, " if needed_bytes else ""
            return cls(
                f"no space left on the device of {path} ({need}{human_bytes(free) if free is not None else '?'} "
                "free); free some space or write elsewhere"
            )
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            refused = cls(f"{path} cannot be written ({error.strerror}); choose a location you can write to")
            refused.exit_code = EXIT_USAGE
            return refused
        if error.errno in (errno.ENOTDIR, errno.EEXIST) and (in_the_way := _file_in_the_way(path)):
            refused = cls(
                f"{path} cannot be created: {in_the_way} is a file, not a directory; choose another location, "
                "or move the file away"
            )
            refused.exit_code = EXIT_USAGE
            return refused
        return cls(f"writing {path} failed ({type(error).__name__}: {error})")


def _file_in_the_way(path: Path) -> Path | None:
    """`path` itself or the parent of it that exists and is not a directory, if any."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the file system of `path` (or of its nearest existing parent)."""
    for candidate in (Path(path), *Path(path).parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return None


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind `error`: itself, its cause or context, or one of the per-rank failures a
    torch.distributed.checkpoint CheckpointException carries ({rank: (exception, traceback)})."""
    seen: set[int] = set()
    todo: list[object] = [error]
    while todo:
        e = todo.pop()
        if isinstance(e, tuple):
            todo.extend(e)
            continue
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e
        todo += [e.__cause__, e.__context__, *getattr(e, "failures", {}).values()]
    return None
