"""A run's checkpoints: save every trained role and the trainer's own state, atomically; find the one
to resume from.

    <output_dir>/checkpoints/
      latest                 "step_6": the newest complete checkpoint, rewritten only after it is complete
      step_6/
        trainer_state.json   step, data position, KL controller, prompt-uid counter, bad steps, best
                             validation score, the driver's RNG states
        config.yaml          the resolved config of the run that saved it
        actor/  critic/      each trained role's checkpoint (megarl.checkpoint.role): weights, optimizer,
                             LR schedule, per-rank RNG — `megarl convert mcore-to-hf` reads actor/ directly
      step_8.partial/        a save in progress or one that was interrupted: never resumed from; the next
                             save removes it
      step_9.superseded/     a checkpoint after the step a later run (re)started from, kept aside:
                             never resumed from, pruned or overwritten (delete it yourself)

A save writes `step_<N>.partial/` (every rank its shards), renames it to `step_<N>/` once every role has
returned, and only then points `latest` at it (written to a temporary file and renamed over the old one),
so a crash at any moment leaves the previous checkpoint as `latest`. The file system must be shared by
every node (as for any megatron checkpoint).
"""

from __future__ import annotations

import errno
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megarl.atomic_write import write_text_atomically
from megarl.checkpoint.paths import (
    CHECKPOINTS_DIR,
    LATEST_FILE,
    PARTIAL_SUFFIX,
    CheckpointNotFoundError,
    complete_steps,
    resolve_role_checkpoint,
    step_dir_name,
)
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.output_guard import free_bytes, human_bytes, os_error_in

TRAINER_STATE = "trainer_state.json"
STATE_VERSION = 1
SUPERSEDED_SUFFIX = ".superseded"  # checkpoints after the step a run resumed from, kept aside
DELETING_SUFFIX = ".deleting"  # a pruned checkpoint being deleted


class ResumeError(MegarlError, ValueError):
    """trainer.resume names something that is not a complete checkpoint, or one this run cannot use."""

    exit_code = EXIT_USAGE


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIR


def step_paths(root: Path) -> list[Path]:
    """Every complete step directory under `root` (a checkpoints/ directory), oldest first."""
    return [root / name for name in complete_steps(root)] if root.is_dir() else []


def resolve_resume(resume: str, output_dir: str | Path) -> Path | None:
    """The step directory trainer.resume (auto | disable | a path) names, or None to start afresh.

    "auto" with no `latest` file takes the newest complete step (a run killed between renaming its
    first checkpoint into place and writing `latest`), and starts afresh when there is none."""
    if resume == "disable":
        return None
    if resume == "auto":
        root = checkpoints_dir(output_dir)
        if not (root / LATEST_FILE).is_file():
            steps = step_paths(root)
            return steps[-1] if steps else None
        resume = str(root)
    if (Path(resume) / TRAINER_STATE).is_file():  # a step directory, under whatever name
        return Path(resume)
    try:
        step_dir = resolve_role_checkpoint(resume, "actor").parent
    except CheckpointNotFoundError as e:
        raise ResumeError(f"trainer.resume={resume}: {e}") from None
    if not (step_dir / TRAINER_STATE).is_file():
        raise ResumeError(
            f"trainer.resume={resume}: {step_dir} is not a training run's checkpoint (no {TRAINER_STATE}); "
            "name a step directory of a run, e.g. <run>/checkpoints/step_<N>, or use trainer.resume=auto"
        )
    return step_dir


def resume_advice(output_dir: str | Path, resume: str) -> str:
    """What rerunning the same command does, read from the checkpoints on disk now: the checkpoint
    trainer.resume (auto | disable | a path) resumes from, or that the run starts afresh — the line a
    failed run ends with."""
    steps = step_paths(checkpoints_dir(output_dir))
    if resume == "disable":
        if steps:
            return f"rerunning starts afresh (trainer.resume=disable); rerun with trainer.resume=auto to resume from {steps[-1]}"
        return "rerunning starts afresh (trainer.resume=disable)"
    if resume != "auto":
        return f"rerunning resumes from trainer.resume={resume} again" + (
            f"; rerun with trainer.resume=auto to resume from {steps[-1]}" if steps else ""
        )
    try:
        step_dir = resolve_resume(resume, output_dir)
    except MegarlError:
        step_dir = steps[-1] if steps else None
    if step_dir is None:
        return (
            f"no checkpoint was saved under {checkpoints_dir(output_dir)}, so rerunning starts from step 0 "
            "(trainer.save_every=N saves every N steps)"
        )
    return f"rerun the same command to resume from {step_dir} (trainer.resume=auto)"


RL_JOB = "rl"  # what a checkpoint without a "job" (the RL trainer's, issue 13's format) was saved by


def check_job(step_dir: Path, state: dict[str, Any], job: str) -> None:
    """The checkpoint was saved by the same kind of run (RL, sft, dpo, …): another's state does not fit."""
    saved = state.get("job", RL_JOB)
    if saved != job:

        def name(j: str) -> str:
            return "megarl train (RL)" if j == RL_JOB else f"megarl {j}"

        raise ResumeError(
            f"{step_dir} was saved by {name(saved)}, but this run is {name(job)}; give this run its own "
            "trainer.output_dir, or start afresh with trainer.resume=disable"
        )


def read_trainer_state(step_dir: Path) -> dict[str, Any]:
    """The checkpoint's trainer_state.json, its fields checked: a damaged file is named with the field
    at fault (ResumeError), before any worker starts."""
    path = step_dir / TRAINER_STATE
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResumeError(
            f"{path} cannot be read ({type(e).__name__}: {e}); {_DAMAGED_ADVICE.format(run=step_dir.parent)}"
        ) from None
    if not isinstance(state, dict):
        raise ResumeError(
            f"{path} holds a JSON {type(state).__name__}, not the trainer's state (an object); "
            + _DAMAGED_ADVICE.format(run=step_dir.parent)
        )
    if state.get("version") != STATE_VERSION:
        raise ResumeError(f"{path}: trainer state version {state.get('version')} is not {STATE_VERSION}")
    fields = {**_STATE_FIELDS, **(_RL_STATE_FIELDS if state.get("job", RL_JOB) == RL_JOB else {})}
    for name, (kinds, what) in fields.items():
        value: Any = state
        for part in name.split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if value is _MISSING and name in _OPTIONAL:
            continue
        if value is _MISSING:
            problem = "is missing"
        elif not isinstance(value, kinds) or isinstance(value, bool) or (what.endswith("≥ 0") and value < 0):
            problem = f"is {json.dumps(value)[:60]}, not {what}"
        else:
            continue
        raise ResumeError(f"{path}: field '{name}' {problem}; {_DAMAGED_ADVICE.format(run=step_dir.parent)}")
    return state


_MISSING = object()
_DAMAGED_ADVICE = (
    "the file is damaged: resume from an earlier step directory (trainer.resume={run}/step_<N>) "
    "or start afresh with trainer.resume=disable"
)
_COUNT = ((int,), "a whole number ≥ 0")
# what every trainer's state holds ({field: (types, in words)}), and what the RL trainer's adds
_STATE_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "step": _COUNT,
    "job": ((str,), "a job name (rl, sft, dpo, …)"),
    "data": ((dict,), "an object (the data position)"),
    "data_files": ((list,), "a list of the training files' fingerprints"),
}
_RL_STATE_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "data.epoch": _COUNT,
    "data.position": _COUNT,
    "data.seed": ((int,), "a whole number (data.seed)"),
    "kl_ctrl": ((dict,), "an object"),
    "next_uid": _COUNT,
    "best_val_reward": ((float, int, type(None)), "a number or null"),
    "bad_steps": ((dict,), "an object"),
    "driver_rng": ((dict,), "an object"),
}
_OPTIONAL = {"job", "data_files"}  # absent from the checkpoints of earlier megarl versions


def check_data_files(step_dir: Path, state: dict[str, Any], ours: list[dict[str, Any]]) -> str | None:
    """The training files (data.train_files) hold the bytes the checkpoint was trained on (their
    fingerprints: megarl.data.files.fingerprint_files; paths may differ): ResumeError naming the files
    otherwise. Returns a note for a checkpoint saved before fingerprints were kept."""
    saved = state.get("data_files")
    if saved is None:
        return (
            f"{step_dir} holds no fingerprint of its training files (saved by an earlier megarl): only their "
            "row count and data.seed are compared"
        )
    saved = [f if isinstance(f, dict) else {} for f in saved]
    if [f.get("sha256") for f in saved] == [f["sha256"] for f in ours]:
        return None

    def describe(files: list[dict[str, Any]]) -> str:
        return ", ".join(
            f"{f.get('path')} ({f.get('bytes')} bytes, sha256 {str(f.get('sha256'))[:12]}…)" for f in files
        )

    raise ResumeError(
        f"{step_dir} was trained on other data: data.train_files = {describe(ours)}; the checkpoint's were "
        f"{describe(saved)}. Resume with the files it was trained on, or start afresh with "
        "trainer.resume=disable (or another trainer.output_dir)"
    )


TRAINED_ROLES = ("actor", "critic")


def check_resumable(step_dir: Path, roles: list[str]) -> None:
    """Every trained role this run starts must be in the checkpoint."""
    missing = [r for r in roles if r in TRAINED_ROLES and not (step_dir / r).is_dir()]
    if missing:
        present = sorted(p.name for p in step_dir.iterdir() if p.is_dir())
        raise ResumeError(
            f"{step_dir} has no checkpoint of the {', '.join(missing)} role (it has: {', '.join(present)}); "
            "resume with the roles it was saved with, or start afresh with trainer.resume=disable"
        )


def precheck_roles(step_dir: Path, cfg: Any, total_steps: int, roles: list[str]) -> None:
    """Before any worker starts: each trained role's checkpoint is complete (every file of its manifest
    present at its size) and of the model the config builds for that role (architecture, vocabulary).
    The workers then verify the checksums, split over their ranks, when they load."""
    from megarl.checkpoint import manifest as mf
    from megarl.checkpoint.format import CheckpointError, read_meta
    from megarl.checkpoint.lora_state import check_lora
    from megarl.checkpoint.role import check_fingerprint
    from megarl.checkpoint.role_common import check_hf_fingerprint
    from megarl.config.roles import role_spec
    from megarl.models.from_hf import ModelArchitecture

    for role in (r for r in roles if r in TRAINED_ROLES):
        role_dir = step_dir / role
        meta = read_meta(role_dir)
        problems = mf.check_files(role_dir, mf.read_manifest(role_dir), checksums=False)
        if problems:
            raise CheckpointError(
                f"{role_dir} is incomplete or damaged:\n  "
                + "\n  ".join(problems)
                + "\nresume from an earlier checkpoint (trainer.resume=<run>/checkpoints/step_<N>)"
            )
        spec = role_spec(cfg, role, total_steps)
        model_path = spec.model.path
        if meta.get("backend") == "fsdp":  # any transformers model: its config.json is the fingerprint
            from transformers import AutoConfig

            check_hf_fingerprint(meta, AutoConfig.from_pretrained(model_path), role_dir, model_path)
            continue
        arch = ModelArchitecture.from_pretrained(model_path)
        # the critic, and the reward model the rm job trains in the actor's place, have a scalar head
        scalar = role == "critic" or cfg.algorithm.name == "rm"
        check_fingerprint(meta, arch.with_scalar_head() if scalar else arch, role_dir, model_path)
        check_lora(meta, getattr(spec, "lora", None), arch, role_dir, role)  # adapter-only or full alike


def capture_rng() -> dict[str, Any]:
    """The driver's Python, NumPy and torch (CPU) RNG states, as JSON (the workers save their own)."""
    import torch

    from megarl.checkpoint.rng_state import python_numpy_state

    return {**python_numpy_state(), "torch": torch.get_rng_state().tolist()}


def restore_rng(state: dict[str, Any]) -> None:
    import torch

    from megarl.checkpoint.rng_state import restore_python_numpy

    restore_python_numpy(state)
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


@dataclass
class SaveReport:
    path: Path
    seconds: float
    bytes: int

    def metrics(self) -> dict[str, float]:
        """What a step logs about its save."""
        return {"timing/save_checkpoint": self.seconds, "checkpoint/bytes": float(self.bytes)}


def save_due(step: int, total_steps: int, save_every: int) -> bool:
    """trainer.save_every: every N steps and after the last; 0 = only after the last; -1 = never."""
    return save_every >= 0 and (step == total_steps or (save_every > 0 and step % save_every == 0))


class RunCheckpoints:
    """Saves and prunes the checkpoints of one run. `groups` = {role: worker group} of the trained roles;
    only the writer (the driver, or rank 0 under torchrun) touches the directories, but every process
    calls `save` (the group calls are collective under torchrun)."""

    def __init__(
        self,
        output_dir: str | Path,
        groups: dict[str, Any],
        is_writer: bool,
        max_checkpoints: int | None = None,
        spmd: bool = False,
        run_state: dict[str, Any] | None = None,
    ) -> None:
        """`run_state`: what every save's trainer_state.json holds besides the trainer's own (the data
        files' fingerprints)."""
        self.run_state = run_state or {}
        self.root = checkpoints_dir(output_dir)
        self.groups = {role: g for role, g in groups.items() if g is not None}
        self.is_writer, self.max_checkpoints, self.spmd = is_writer, max_checkpoints, spmd
        self.saved_step: int | None = None  # the step of this run's last complete save

    def supersede_after(self, step: int) -> list[str]:
        """Rename the complete checkpoints after `step` (a resumed run's future, or a fresh run's
        predecessor in the same output_dir) to `step_<N>.superseded`: never resumed from, never pruned,
        never overwritten; returns their names. Writer only."""
        later = [path for path in step_paths(self.root) if _step_of(path) > step]
        for path in later:
            path.rename(path.with_name(path.name + SUPERSEDED_SUFFIX))
        if later and (self.root / LATEST_FILE).is_file():
            _point_latest(self.root)
        return [path.name for path in later]

    def save(self, step: int, trainer_state: dict[str, Any], config_yaml: str) -> SaveReport:
        start = time.perf_counter()
        final = self.root / step_dir_name(step)
        staging = self.root / f"{step_dir_name(step)}{PARTIAL_SUFFIX}"
        previous = step_paths(self.root)
        try:
            written = self._write(staging, step, trainer_state, config_yaml)
        except Exception as e:
            if not _disk_full(e, self.root):
                raise
            if self.is_writer:
                shutil.rmtree(staging, ignore_errors=True)  # the space it took, back
            raise CheckpointSaveError.disk_full(self.root, step, previous) from None
        if self.is_writer:
            if final.exists():  # only if something outside this run made it: keep it, out of the way
                final.rename(final.with_name(final.name + SUPERSEDED_SUFFIX))
            staging.rename(final)  # complete under its final name ...
            write_text_atomically(
                self.root / LATEST_FILE, final.name + "\n", durable=True
            )  # ... and only then latest
            self._prune(keep=final)
        self._barrier()
        self.saved_step = step
        return SaveReport(final, time.perf_counter() - start, written)

    def _write(self, staging: Path, step: int, trainer_state: dict[str, Any], config_yaml: str) -> int:
        """Every role's checkpoint and the trainer's state into `staging`; returns the bytes written."""
        if self.is_writer:
            # interrupted saves and interrupted deletions of this or an earlier run
            for stale in [*self.root.glob(f"*{PARTIAL_SUFFIX}"), *self.root.glob(f"*{DELETING_SUFFIX}")]:
                shutil.rmtree(stale, ignore_errors=True)
            staging.mkdir(parents=True)
        self._barrier()
        written = 0
        for role, group in self.groups.items():
            reports = group.save_checkpoint(str(staging / role), {"step": step})
            written += sum(r.get("bytes_written", 0) for r in reports)
        if self.is_writer:
            (staging / "config.yaml").write_text(config_yaml)
            state = {"version": STATE_VERSION, "step": step, **self.run_state, **trainer_state}
            write_text_atomically(staging / TRAINER_STATE, json.dumps(state, indent=2), durable=True)
        return written

    def _prune(self, keep: Path) -> None:
        if self.max_checkpoints is None:
            return
        steps = [path for path in step_paths(self.root) if path != keep]
        for path in steps[: max(0, len(steps) - (self.max_checkpoints - 1))]:
            doomed = path.with_name(path.name + DELETING_SUFFIX)  # never a half-deleted step_<N>/
            path.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def _barrier(self) -> None:
        if self.spmd:
            import torch.distributed as dist

            dist.barrier()


class CheckpointSaveError(MegarlError, OSError):
    """A checkpoint could not be saved (a full disk); the previous one is intact and still `latest`."""

    @classmethod
    def disk_full(cls, root: Path, step: int, previous: list[Path]) -> CheckpointSaveError:
        free = free_bytes(root)
        need = f"a checkpoint takes about {human_bytes(_tree_bytes(previous[-1]))}, " if previous else ""
        kept = (
            f"the previous checkpoint {previous[-1].name} is intact and `latest` still names it"
            if previous
            else "no earlier checkpoint exists"
        )
        return cls(
            f"saving checkpoint {step_dir_name(step)} failed: no space left on the device of {root} ({need}"
            f"{human_bytes(free) if free is not None else '?'} free); the unfinished save was removed and {kept}. "
            "Free some space (trainer.max_checkpoints keeps fewer checkpoints) or move trainer.output_dir to "
            "a larger disk, then rerun to resume"
        )


def _disk_full(error: BaseException, root: Path) -> bool:
    """A save failed for want of space: ENOSPC in the exception, a worker's message saying so (Ray
    delivers it as text), or (megatron's writers can lose the cause) hardly any space left."""
    from megarl.checkpoint.role_common import NEARLY_FULL_BYTES

    cause = os_error_in(error)
    if cause is not None and cause.errno == errno.ENOSPC:
        return True
    if "no space left on" in str(error).lower():
        return True
    free = free_bytes(root)
    return free is not None and free < NEARLY_FULL_BYTES


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix("step_"))


def _point_latest(root: Path) -> None:
    """`latest` → the newest complete step, or no `latest` when none is left."""
    steps = step_paths(root)
    if steps:
        write_text_atomically(root / LATEST_FILE, steps[-1].name + "\n", durable=True)
    else:
        (root / LATEST_FILE).unlink(missing_ok=True)
