"""Find one role's checkpoint in a training run's checkpoint tree (pure path logic, no torch).

A run saves `RUN/checkpoints/step_<N>/<role>/` (role = actor, critic, ...) and then writes
`RUN/checkpoints/latest`, a text file holding the newest complete step's directory name. A save in
progress lives in `step_<N>.partial/` and is never picked. Each role directory is a megarl checkpoint
(`megarl_checkpoint.json`, `hf/`, `model/`, plus training state that exports ignore).

`resolve_role_checkpoint` accepts, for `megarl convert mcore-to-hf --ckpt` and `trainer.resume`:
a role (or converted) checkpoint directory, a step directory, the `latest` file, the `checkpoints`
directory or the run directory.
"""

from __future__ import annotations

import re
from pathlib import Path

from megarl.errors import EXIT_USAGE, MegarlError

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest"
META_FILE = "megarl_checkpoint.json"  # a megarl checkpoint directory's metadata (megarl.checkpoint.format)
PARTIAL_SUFFIX = ".partial"  # a directory being written, renamed into place when complete
_STEP = re.compile(r"^step_(\d+)$")


class CheckpointNotFoundError(MegarlError, FileNotFoundError):
    """The path holds no usable checkpoint; the message says what is there instead."""

    exit_code = EXIT_USAGE


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def complete_steps(checkpoints: Path) -> list[str]:
    """The complete step directories under `checkpoints`, oldest first."""
    found = [
        (int(m.group(1)), p.name) for p in checkpoints.iterdir() if p.is_dir() and (m := _STEP.match(p.name))
    ]
    return [name for _, name in sorted(found)]


def _partial_steps(checkpoints: Path) -> list[str]:
    names = [p.name for p in checkpoints.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    return sorted(
        names, key=lambda n: int(m.group(1)) if (m := _STEP.match(n[: -len(PARTIAL_SUFFIX)])) else -1
    )


def _what_is_there(checkpoints: Path) -> str:
    complete, partial = complete_steps(checkpoints), _partial_steps(checkpoints)
    parts = []
    if complete:
        parts.append("complete: " + ", ".join(complete))
    if partial:
        parts.append("interrupted: " + ", ".join(partial))
    return "; ".join(parts) or "nothing"


def _roles(step: Path) -> list[str]:
    return sorted(p.name for p in step.iterdir() if p.is_dir() and (p / META_FILE).is_file())


def _role_in_step(step: Path, role: str) -> Path:
    if (step / role / META_FILE).is_file():
        return step / role
    roles = _roles(step)
    if (step / role).is_dir():
        raise CheckpointNotFoundError(f"{step}/{role} is not a megarl checkpoint (no {META_FILE})")
    raise CheckpointNotFoundError(
        f"{step.name} has no role {role!r} (it has: {', '.join(roles) or 'no role checkpoints'}); "
        f"pick one with --role"
    )


def _through_latest(checkpoints: Path, role: str) -> Path:
    latest = checkpoints / LATEST_FILE
    if not latest.is_file():
        complete = complete_steps(checkpoints)
        if complete:
            raise CheckpointNotFoundError(
                f"{checkpoints} has no '{LATEST_FILE}' file ({_what_is_there(checkpoints)}); "
                f"pass a step directory, e.g. {checkpoints / complete[-1]}"
            )
        partial = _partial_steps(checkpoints)
        if partial:
            raise CheckpointNotFoundError(
                f"{checkpoints} has no complete checkpoint (only {', '.join(partial)}, interrupted); "
                "nothing complete to load yet"
            )
        raise CheckpointNotFoundError(f"{checkpoints} holds no checkpoints")
    name = latest.read_text().strip()
    if not _STEP.match(name):
        raise CheckpointNotFoundError(
            f"{latest} should name a step directory (like step_6), but holds {name[:60]!r}; "
            f"the run has {_what_is_there(checkpoints)}"
        )
    step = checkpoints / name
    if not step.is_dir():
        raise CheckpointNotFoundError(
            f"{latest} names {name}, which does not exist; the run has {_what_is_there(checkpoints)}"
        )
    return _role_in_step(step, role)


def _nearest_existing(path: Path) -> str:
    """ " (<parent> holds: a, b, c)" of the closest existing parent of a mistyped path, or ""."""
    for parent in path.parents:
        if parent.is_dir():
            names = sorted(p.name for p in parent.iterdir())
            more = f", ... ({len(names) - 8} more)" if len(names) > 8 else ""
            return f" ({parent} holds: {', '.join(names[:8])}{more})" if names else f" ({parent} is empty)"
    return ""


def resolve_role_checkpoint(path: str | Path, role: str = "actor") -> Path:
    """The megarl checkpoint directory of `role` that `path` designates (see the module docstring).

    Raises CheckpointNotFoundError (a FileNotFoundError) saying what the path holds instead.
    """
    path = Path(path)
    if not path.exists():
        partial = Path(str(path).rstrip("/") + PARTIAL_SUFFIX)
        if partial.exists():
            raise CheckpointNotFoundError(
                f"{path} was never completed (only {partial} exists, interrupted); "
                "use an earlier checkpoint or re-run the save"
            )
        raise CheckpointNotFoundError(
            f"{path} does not exist{_nearest_existing(path)}; name a run directory (trainer.output_dir), its "
            "checkpoints/ or checkpoints/step_<N>, or a checkpoint written by `megarl convert hf-to-mcore`"
        )
    if path.name.endswith(PARTIAL_SUFFIX):
        raise CheckpointNotFoundError(
            f"{path} is an interrupted save and is never loaded; pick a complete checkpoint"
        )
    if path.is_file():
        if path.name == LATEST_FILE:
            return _through_latest(path.parent, role)
        raise CheckpointNotFoundError(
            f"{path} is a file; expected a checkpoint directory or a '{LATEST_FILE}' file"
        )
    if (path / META_FILE).is_file():
        return path
    if _STEP.match(path.name):
        return _role_in_step(path, role)
    if (path / LATEST_FILE).is_file() or any(
        _STEP.match(p.name.removesuffix(PARTIAL_SUFFIX)) for p in path.iterdir()
    ):
        return _through_latest(path, role)
    if (path / CHECKPOINTS_DIR).is_dir():
        return _through_latest(path / CHECKPOINTS_DIR, role)
    raise CheckpointNotFoundError(
        f"{path} is not a megarl checkpoint (no {META_FILE}), a step directory or a run with "
        f"'{CHECKPOINTS_DIR}/'; create one with `megarl convert hf-to-mcore` or a training run"
    )
