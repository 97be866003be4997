"""What every backend's role checkpoint shares (megarl.checkpoint.role for Megatron, megarl.fsdp.checkpoint
for FSDP): the all-or-none failure of a collective save, failed saves and loads turned into messages that
name the checkpoint, the bytes each rank wrote, and the LR schedule file."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from megarl.checkpoint import rng_state
from megarl.checkpoint.dist_reader import truncated_files
from megarl.checkpoint.format import CheckpointError
from megarl.errors import MegarlError
from megarl.output_guard import OutputWriteError, free_bytes, os_error_in

OPTIMIZER_DIR = "optimizer"
SCHEDULER_FILE = "scheduler.json"
NEARLY_FULL_BYTES = 16 << 20  # a save that failed with less free than this ran out of space


@contextlib.contextmanager
def load_errors(role_dir: Path, what: str) -> Iterator[None]:
    """Any exception of a megatron/torch load becomes a CheckpointError naming the checkpoint."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        yield
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:
        damaged = truncated_files(role_dir / ("model" if what == "model" else OPTIMIZER_DIR))
        if damaged:
            raise CheckpointError(
                f"loading the {what} of {role_dir} failed: {'; '.join(damaged)}; use an earlier checkpoint"
            ) from None
        first = (str(e).strip().splitlines() or [""])[0][:500]
        raise CheckpointError(
            f"loading the {what} of {role_dir} failed: {type(e).__name__}: {first}"
        ) from None


def rank_bytes(manifest: dict[str, Any], rank: int) -> int:
    """Bytes of the files this rank wrote: its dist-checkpoint shards and RNG files; rank 0 the rest."""

    def writer(path: str) -> int:
        name = path.rsplit("/", 1)[-1]
        if name.startswith("__") and name.endswith(".distcp"):
            return int(name[2:].split("_")[0])
        if path.startswith(f"{rng_state.RNG_DIR}/rank_"):
            return int(name.split("_")[1].split(".")[0])
        return 0

    return sum(e["size"] for e in manifest["files"] if writer(e["path"]) == rank)


def all_or_none(error: str | None) -> None:
    """Every rank raises if any rank failed (its message), instead of some hanging in a barrier."""
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [e for e in errors if e]
    if failed:
        raise CheckpointError("; ".join(dict.fromkeys(failed)))


def save_failure(error: BaseException, role_dir: Path, rank: int) -> MegarlError:
    """What a failed save of `role_dir` tells the user. A full disk is recognised by ENOSPC anywhere in
    the exception (megatron's parallel writers can lose it: "CheckpointException ranks:dict_keys([])")
    or by the space left on the device afterwards."""
    cause = os_error_in(error)
    free = free_bytes(role_dir)
    if (cause is not None and cause.errno == errno.ENOSPC) or (free is not None and free < NEARLY_FULL_BYTES):
        return OutputWriteError.of(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), role_dir, free=free)
    if cause is not None:
        return OutputWriteError.of(cause, role_dir)
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return CheckpointError(f"saving {role_dir} failed on rank {rank}: {type(error).__name__}: {first}")


@contextlib.contextmanager
def save_errors(role_dir: Path, rank: int) -> Iterator[None]:
    """A megatron/DCP save that fails (a BaseException for DCP) becomes a MegarlError naming the path."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except MegarlError:
        raise
    except (Exception, CheckpointException) as e:
        raise save_failure(e, role_dir, rank) from None


def write_schedule(role_dir: Path, scheduler) -> None:
    """scheduler.json: megatron's OptimizerParamScheduler.state_dict()."""
    (role_dir / SCHEDULER_FILE).write_text(json.dumps(scheduler.state_dict(), indent=2))


def load_schedule(role_dir: Path, scheduler) -> bool:
    """Put scheduler.json back into `scheduler` (False when the checkpoint has none)."""
    if not (role_dir / SCHEDULER_FILE).is_file():
        return False
    try:
        schedule = json.loads((role_dir / SCHEDULER_FILE).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{role_dir / SCHEDULER_FILE} is corrupt ({e})") from None
    scheduler.num_steps = 0  # load_state_dict advances by the saved count
    scheduler.load_state_dict(schedule)
    return True


def load_rank_state(role_dir: Path, rank: int, same_layout: bool, load_rng: bool) -> tuple[dict, str]:
    """(the worker's extra state, what happened to the RNG) of a load: this rank's random states and
    counters at the saved layout, else rank 0's counters only (random states mean something on their own
    rank alone)."""
    if same_layout and load_rng:
        return rng_state.restore(*rng_state.read_rank_state(role_dir, rank)), "restored"
    info, _ = rng_state.read_rank_state(role_dir, 0)
    return dict(info.get("extra", {})), "reseeded (layout changed)" if not same_layout else "not loaded"


def wrong_backend(role_dir: Path, meta: dict[str, Any], expected: str) -> CheckpointError | None:
    """The error for loading a checkpoint another backend wrote (megarl_checkpoint.json's `backend`;
    a checkpoint without one is Megatron's), or None when it is `expected`'s."""
    saved = meta.get("backend", "megatron")
    if saved == expected:
        return None
    role = meta.get("role", "<role>")
    return CheckpointError(
        f"{role_dir}: this role's checkpoint was written by the {saved} backend; set {role}.backend={saved} "
        f"to resume it (the {expected} backend cannot load it)"
    )


# The HF config entries that must match between an FSDP role's checkpoint and the model it is loaded into.
HF_FINGERPRINT_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)


def hf_fingerprint(config) -> dict[str, Any]:
    """The HF_FINGERPRINT_KEYS of a transformers config (or its config.json as a dict) that it has; a
    multimodal config's text part is the one compared."""
    if not isinstance(config, dict):
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        config = {**text.to_dict(), "model_type": config.model_type}
    return {key: config[key] for key in HF_FINGERPRINT_KEYS if key in config}


def check_hf_fingerprint(meta: dict[str, Any], config, role_dir: str | Path, model: str) -> None:
    """CheckpointError naming every differing entry when `role_dir` (an FSDP role's checkpoint) was saved
    from another model than `config`'s (a transformers config or config.json dict)."""
    refuse_other_model(meta.get("architecture") or {}, hf_fingerprint(config), role_dir, model)


def refuse_other_model(saved: dict[str, Any], ours: dict[str, Any], role_dir: str | Path, model: str) -> None:
    """CheckpointError naming every entry of the fingerprint `ours` that the saved one holds otherwise."""
    differ = [k for k in ours if k in saved and saved[k] != ours[k]]
    if differ:
        raise CheckpointError(
            f"{role_dir} was saved from a model with {', '.join(f'{k} {saved[k]}' for k in differ)}; "
            f"the config's model ({model}) has {', '.join(f'{k} {ours[k]}' for k in differ)}; "
            "point trainer.resume at a checkpoint of this model or change model.path"
        )
