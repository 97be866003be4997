"""`Batch`: the row-aligned container the driver passes to worker groups.

A Batch holds N rows as tensor columns (a `TensorDict` with batch_size [N]), non-tensor columns (1-D numpy
object arrays of length N: prompts, reward-model inputs, ...) and `meta`, a plain dict that is carried along
unsplit (temperature, global step). Dispatch splits it with `chunk`/`pad_to_multiple` and collects worker
outputs with `Batch.concat`/`unpad`. Pickling packs every tensor into one contiguous byte buffer, so sending a
Batch through Ray costs about as much as sending its raw bytes.

`Col` names the columns of an RL step, one spelling for every stage (verl's names).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import torch
from tensordict import TensorDict

Index: TypeAlias = slice | int | Sequence[int] | torch.Tensor | np.ndarray

# Tensor offsets inside the pickled buffer are aligned so every dtype can be viewed in place.
_ALIGN = 64


def _leaves(td: TensorDict) -> Iterator[tuple[str | tuple[str, ...], torch.Tensor]]:
    yield from td.items(include_nested=True, leaves_only=True)


def _object_column(key: str, values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"non-tensor column {key!r} must be 1-D, got shape {values.shape}")
        return values
    column: np.ndarray = np.empty(len(values), dtype=object)
    column[:] = list(values)
    return column


def _columns_equal(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        # Bitwise, so a column holding NaNs (masked logprobs) still equals itself.
        same_layout = a.shape == b.shape and a.dtype == b.dtype
        return same_layout and torch.equal(_as_bytes(a), _as_bytes(b.to(a.device)))
    return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def _values_equal(x: Any, y: Any) -> bool:
    result = x == y
    return bool(np.all(result)) if isinstance(result, np.ndarray) else bool(result)


def _as_index(index: Index, n: int) -> torch.Tensor:
    """A 1-D int64 CPU tensor of row ids for a list, int, numpy array or (bool or int) tensor."""
    idx = torch.as_tensor(index).cpu()
    if idx.numel() == 0:
        return idx.reshape(0).long()
    if idx.dtype == torch.bool:
        if idx.shape != (n,):
            raise ValueError(f"boolean row mask has shape {tuple(idx.shape)}, expected ({n},)")
        return idx.nonzero().squeeze(1)
    if idx.is_floating_point() or idx.is_complex():
        raise TypeError(f"row indices must be integers or a boolean mask, got dtype {idx.dtype}")
    return idx.long().reshape(-1)


class Col:
    """The Batch columns of an RL step: who writes each, its shape and dtype (n rows, P prompt columns,
    R response columns; a prompt's samples are adjacent rows sharing its `uid`)."""

    # The prompt batch (the dataset), carried through the rollout.
    PROMPTS = "prompts"  # [n, P] long: prompt tokens, left-padded with the pad id
    # [n, P] long on the prompt batch; [n, P+R] on the rollout batch: 1 on every real prompt and
    # response token, i.e. the tokens the model reads
    ATTENTION_MASK = "attention_mask"
    UID = "uid"  # [n] long: the prompt's group id (the rollout numbers the prompts when it is absent)
    # [n] non-tensor, from megarl.data.PromptDataset: the row's task (which rule reward scores it), its
    # reference answer and its extra fields, handed to the reward function
    DATA_SOURCE = "data_source"
    GROUND_TRUTH = "ground_truth"
    EXTRA_INFO = "extra_info"

    # The rollout (megarl.rollout.base.rollout_batch).
    RESPONSES = "responses"  # [n, R] long: response tokens, right-padded with the pad id
    INPUT_IDS = "input_ids"  # [n, P+R] long: prompts ‖ responses
    # [n, R] float: 1 on the response tokens the policy produced and is trained on; 0 on padding and on
    # tokens a multi-turn rollout inserted (tool outputs), which the model still reads
    RESPONSE_MASK = "response_mask"
    ROLLOUT_LOG_PROBS = "rollout_log_probs"  # [n, R] fp32: the engine's log-prob of each sampled token
    FINISH_REASON = "finish_reason"  # [n] str, non-tensor: "stop" or "length"
    # Partial rollouts (generate(..., between_steps=...), megarl.rollout.partial): a response may span
    # weight syncs. [n, R] long: the weights version that sampled each response token, -1 on padding
    ROLLOUT_TOKEN_VERSIONS = "rollout_token_versions"
    # [n] long: the oldest weights version among the row's tokens (training steps done: a separate rollout
    # pool, megarl.workers.rollout_worker; the colocated engine always runs the current weights)
    ROLLOUT_VERSION = "rollout_version"
    # Multi-turn rollouts (rollout.multi_turn) only. [n, R] fp32: each assistant turn's score on that turn's
    # last generated token, 0 elsewhere (never on a given token); the token_rewards stage adds it to the
    # sequence's score in token_level_scores
    TURN_REWARDS = "turn_rewards"
    # MoE routing replay (actor.router_replay, megarl.models.moe_replay). [n, P+R, L, k] int16, aligned with
    # input_ids: the experts each token was routed to in each of the L MoE layers (R3: by the engine; R2:
    # by the actor's old-log-prob forward), -1 on padding and where no route is known (routed live)
    ROUTED_EXPERTS = "routed_experts"

    # The workers; per-token values are 0 where response_mask is 0.
    OLD_LOG_PROBS = "old_log_probs"  # [n, R] fp32: the actor's log-probs before the update (log_prob)
    ENTROPY = "entropy"  # [n, R] fp32: the actor's entropy of each token's distribution (log_prob)
    # [n, R] fp32: Σ_v π_v² of each token's distribution (log_prob, when the estimator needs it: OTB)
    SUM_PI_SQUARED = "sum_pi_squared"
    REF_LOG_PROBS = "ref_log_probs"  # [n, R] fp32: the reference policy's log-probs (ref_log_prob)
    VALUES = "values"  # [n, R] fp32: the critic's V(state before each response token) (critic.values)
    RM_SCORES = "rm_scores"  # [n] fp32: the reward model's score of each sequence (compute_rm_score)

    # The driver (megarl.algorithms on the whole batch).
    SCORES = "scores"  # [n] fp32: each sequence's reward (the trainer's reward stage)
    BASELINE_SCORES = "baseline_scores"  # [n] fp32: ReMax's greedy-response score of the sample's prompt
    # [n, R] fp32: each sequence's score on its last generated token (response_mask 1), plus turn_rewards
    TOKEN_LEVEL_SCORES = "token_level_scores"
    # [n, R] fp32: truncated IS weights old / rollout of each token (algorithm.rollout_correction.rollout_is)
    ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
    TOKEN_LEVEL_REWARDS = "token_level_rewards"  # [n, R] fp32: the scores less the in-reward KL penalty
    ADVANTAGES = "advantages"  # [n, R] fp32: the estimator's advantages (compute_advantages)
    RETURNS = "returns"  # [n, R] fp32: the critic's targets (compute_advantages)


class Batch:
    """N rows of tensor and non-tensor columns, plus unsplit `meta`. Row ops return new Batches."""

    def __init__(
        self,
        tensors: TensorDict | dict[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, np.ndarray | Sequence[Any]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        td = tensors if isinstance(tensors, TensorDict) else TensorDict(tensors or {}, batch_size=[])
        self.non_tensors: dict[str, np.ndarray] = {
            k: _object_column(k, v) for k, v in (non_tensors or {}).items()
        }
        self.meta: dict[str, Any] = dict(meta or {})
        n = self._infer_rows(td)
        for key, t in _leaves(td):
            if t.dim() == 0:
                raise ValueError(f"tensor column {key!r} is a scalar; put per-batch scalars in meta")
            if t.shape[0] != n:
                raise ValueError(f"tensor column {key!r} has {t.shape[0]} rows but the batch has N={n}")
        for key, column in self.non_tensors.items():
            if len(column) != n:
                raise ValueError(f"non-tensor column {key!r} has {len(column)} rows but the batch has N={n}")
        if td.batch_size != torch.Size([n]):
            td = td.clone(recurse=False)
            td.batch_size = [n]
        self.tensors: TensorDict = td

    def _infer_rows(self, td: TensorDict) -> int:
        if td.batch_dims and (not td.is_empty() or not self.non_tensors):
            return td.batch_size[0]
        for _, t in _leaves(td):
            return t.shape[0] if t.dim() else 0
        for column in self.non_tensors.values():
            return len(column)
        return td.batch_size[0] if td.batch_dims else 0

    def _new(self, tensors: TensorDict, non_tensors: dict[str, np.ndarray]) -> Batch:
        return Batch(tensors, non_tensors, dict(self.meta))

    def __len__(self) -> int:
        return self.tensors.batch_size[0]

    def keys(self) -> list[str]:
        """Tensor column names, then non-tensor column names."""
        return list(self.tensors.keys()) + list(self.non_tensors)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors.keys() or key in self.non_tensors

    def __getitem__(self, key: str | Index) -> Any:
        """`batch["name"]` is a column; `batch[i:j]`, `batch[[3, 1]]`, `batch[tensor]`, `batch[mask]` and
        `batch[i]` are row-selected Batches (slices share storage, index lists copy)."""
        if isinstance(key, str):
            if key in self.non_tensors:
                return self.non_tensors[key]
            if key in self.tensors.keys():
                return self.tensors[key]
            raise KeyError(f"no column {key!r}; columns are {self.keys()}")
        if isinstance(key, slice):
            return self._new(self.tensors[key], {k: v[key] for k, v in self.non_tensors.items()})
        idx = _as_index(key, len(self))
        rows = idx.numpy()
        return self._new(self.tensors[idx], {k: v[rows] for k, v in self.non_tensors.items()})

    def __setitem__(self, key: str, value: torch.Tensor | np.ndarray | Sequence[Any]) -> None:
        """Adds or replaces a column: tensors go to `tensors`, anything else to `non_tensors`."""
        rest = self.select([k for k in self.keys() if k != key])
        if rest.keys() and len(value) != len(self):
            raise ValueError(f"column {key!r} has {len(value)} rows but the batch has N={len(self)}")
        if isinstance(value, torch.Tensor):
            tensors = rest.tensors.clone(recurse=False)
            tensors.batch_size = []
            tensors.set(key, value)
            updated = Batch(tensors, rest.non_tensors)
        else:
            updated = Batch(rest.tensors, {**rest.non_tensors, key: value})
        self.tensors, self.non_tensors = updated.tensors, updated.non_tensors

    def __repr__(self) -> str:
        tensors = {k: f"{tuple(t.shape)} {t.dtype}" for k, t in _leaves(self.tensors)}
        return (
            f"Batch(n={len(self)}, tensors={tensors}, non_tensors={list(self.non_tensors)}, meta={self.meta})"
        )

    def select(self, keys: Iterable[str], meta_keys: Iterable[str] | None = None) -> Batch:
        """A Batch with only the named columns; all meta unless `meta_keys` is given."""
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"no columns {missing}; columns are {self.keys()}")
        tensor_keys = [k for k in keys if k in self.tensors.keys()]
        meta = dict(self.meta) if meta_keys is None else {k: self.meta[k] for k in meta_keys}
        tensors = self.tensors.select(*tensor_keys)
        return Batch(tensors, {k: self.non_tensors[k] for k in keys if k in self.non_tensors}, meta)

    def union(self, other: Batch) -> Batch:
        """Columns and meta of both; shared columns and meta keys must hold equal values."""
        if self.keys() and other.keys() and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        for key in set(self.keys()) & set(other.keys()):
            if not _columns_equal(self[key], other[key]):
                raise ValueError(f"column {key!r} differs between the two batches; rename one before union")
        for key in set(self.meta) & set(other.meta):
            if not _values_equal(self.meta[key], other.meta[key]):
                raise ValueError(f"meta {key!r} differs: {self.meta[key]!r} vs {other.meta[key]!r}")
        base, extra = (self, other) if self.keys() or not other.keys() else (other, self)
        tensors = base.tensors.clone(recurse=False)
        tensors.update({k: v for k, v in extra.tensors.items() if k not in tensors.keys()})
        return Batch(tensors, {**self.non_tensors, **other.non_tensors}, {**self.meta, **other.meta})

    def chunk(self, n: int) -> list[Batch]:
        """`n` equal consecutive parts (views); N must be divisible by `n`."""
        if n <= 0:
            raise ValueError(f"chunk count must be positive, got {n}")
        if len(self) % n:
            raise ValueError(
                f"cannot split {len(self)} rows into {n} equal chunks; call pad_to_multiple({n}) first "
                "and unpad the collected result"
            )
        size = len(self) // n
        return [self[i * size : (i + 1) * size] for i in range(n)]

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all `batches` in order; columns must match, meta comes from the first."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        first = batches[0]
        for i, b in enumerate(batches[1:], start=1):
            if set(b.keys()) != set(first.keys()):
                raise ValueError(
                    f"batch {i} has columns {sorted(b.keys())}, batch 0 has {sorted(first.keys())}"
                )
        tensors = torch.cat([b.tensors for b in batches], dim=0)
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors}
        return Batch(tensors, non_tensors, dict(first.meta))

    def pad_to_multiple(self, k: int) -> tuple[Batch, int]:
        """Pads to a multiple of `k` rows by repeating rows 0, 1, ... cyclically; returns (batch, pad)."""
        if k <= 0:
            raise ValueError(f"pad multiple must be positive, got {k}")
        pad = -len(self) % k
        if pad == 0:
            return self[:], 0
        if len(self) == 0:
            raise ValueError("cannot pad an empty batch")
        return self[torch.arange(len(self) + pad) % len(self)], pad

    def unpad(self, pad: int) -> Batch:
        """Drops the last `pad` rows (the count returned by `pad_to_multiple`)."""
        if not 0 <= pad <= len(self):
            raise ValueError(f"pad={pad} is outside [0, {len(self)}]")
        return self[: len(self) - pad]

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row `n` times: interleaved (a a b b) for n samples per prompt, else tiled (a b a b)."""
        rows = torch.arange(len(self))
        return self[rows.repeat_interleave(n) if interleave else rows.repeat(n)]

    def reorder(self, indices: Index) -> Batch:
        """A new Batch whose row i is row `indices[i]`; `indices` must be a permutation of range(N)."""
        idx = _as_index(indices, len(self))
        if not torch.equal(idx.sort().values, torch.arange(len(self))):
            raise ValueError(f"reorder indices must be a permutation of range({len(self)})")
        return self[idx]

    def rows(self) -> Iterator[Batch]:
        """Single-row Batches, in order."""
        for i in range(len(self)):
            yield self[i : i + 1]

    def to(self, device: torch.device | str) -> Batch:
        """Tensors moved to `device`; non-tensor columns are shared, meta is copied."""
        return self._new(self.tensors.to(device), dict(self.non_tensors))

    def __getstate__(self) -> dict[str, Any]:
        # One flat uint8 numpy buffer: numpy pickles (and Ray ships) it as a single blob, where pickling each
        # tensor goes through torch's slower per-storage serialization. Unpickled tensors land on CPU.
        leaves, layout, offset = list(_leaves(self.tensors)), [], 0
        for key, t in leaves:
            nbytes = t.numel() * t.element_size()
            layout.append((key, t.dtype, tuple(t.shape), offset, nbytes))
            offset += -(-nbytes // _ALIGN) * _ALIGN
        buffer: np.ndarray = np.empty(offset, dtype=np.uint8)
        flat = torch.from_numpy(buffer)
        for (_, t), (_, _, _, start, nbytes) in zip(leaves, layout):
            flat[start : start + nbytes].copy_(_as_bytes(t))
        state = {"n": len(self), "buffer": buffer, "layout": layout}
        return {**state, "non_tensors": self.non_tensors, "meta": self.meta}

    def __setstate__(self, state: dict[str, Any]) -> None:
        buffer = state["buffer"]
        if not buffer.flags.writeable:  # Ray's zero-copy arrays are read-only; workers write columns in place
            buffer = buffer.copy()
        flat = torch.from_numpy(buffer)
        tensors = TensorDict({}, batch_size=[state["n"]])
        for key, dtype, shape, start, nbytes in state["layout"]:
            tensors.set(key, flat[start : start + nbytes].view(dtype).view(shape))
        self.tensors, self.non_tensors, self.meta = tensors, state["non_tensors"], state["meta"]
