"""Split a full megatron tensor into TP shards and join them back, by its ParamKind (pure tensor code).

A "full" tensor is what a TP=1 megatron model holds; the kinds are described in
megarl/distributed/param_kind.py.
"""

from __future__ import annotations

import torch

from megarl.distributed.param_kind import ParamKind


def shard(
    kind: ParamKind | str, full: torch.Tensor, tp_rank: int, tp: int, padded_rows: int | None = None
) -> torch.Tensor:
    """The TP shard of `full` held by `tp_rank`."""
    kind = ParamKind.of(kind)
    if kind is ParamKind.REPLICATED:
        return full
    if kind is ParamKind.VOCAB:
        if padded_rows is None:
            raise ValueError("vocab shards need padded_rows")
        pad = padded_rows - full.shape[0]
        if pad < 0:
            raise ValueError(f"vocabulary {full.shape[0]} is larger than the padded size {padded_rows}")
        full = torch.cat([full, full.new_zeros(pad, *full.shape[1:])]) if pad else full
        return full.chunk(tp, dim=0)[tp_rank]
    if kind in (ParamKind.COLUMN, ParamKind.QKV):
        return full.chunk(tp, dim=0)[tp_rank]
    if kind is ParamKind.ROW:
        return full.chunk(tp, dim=1)[tp_rank]
    if kind is ParamKind.GATE_UP:
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[tp_rank], up.chunk(tp, dim=0)[tp_rank]])
    raise AssertionError(f"unhandled parameter kind {kind}")


def unshard(kind: ParamKind | str, shards: list[torch.Tensor], vocab_size: int | None = None) -> torch.Tensor:
    """Inverse of `shard`: the full tensor from every TP rank's shard (padding rows removed)."""
    kind = ParamKind.of(kind)
    if kind is ParamKind.REPLICATED:
        return shards[0]
    if kind is ParamKind.VOCAB:
        if vocab_size is None:
            raise ValueError("vocab unshard needs vocab_size")
        return torch.cat(shards, dim=0)[:vocab_size]
    if kind in (ParamKind.COLUMN, ParamKind.QKV):
        return torch.cat(shards, dim=0)
    if kind is ParamKind.ROW:
        return torch.cat(shards, dim=1)
    if kind is ParamKind.GATE_UP:
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    raise AssertionError(f"unhandled parameter kind {kind}")
