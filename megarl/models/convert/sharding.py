"""How each kind of megatron parameter is laid out across tensor-parallel ranks (pure tensor code).

A "full" tensor is what a TP=1 megatron model holds. The kinds:
  replicated  every TP rank holds the whole tensor (norms)
  column      split along dim 0 (output features)
  row         split along dim 1 (input features)
  qkv         fused q/k/v grouped per query group: [g0: q.. k v | g1: q.. k v | ...]; TP splits whole
              groups, so a plain dim-0 split is right (tp must divide the number of query groups)
  gate_up     SwiGLU fc1 = [gate; up] *per TP shard*: shard i is [gate_i; up_i], not a slice of [gate; up]
  vocab       rows padded to the padded vocabulary, then split along dim 0
"""

from __future__ import annotations

import torch

KINDS = ("replicated", "column", "row", "qkv", "gate_up", "vocab")


def shard(
    kind: str, full: torch.Tensor, tp_rank: int, tp: int, padded_rows: int | None = None
) -> torch.Tensor:
    """The TP shard of `full` held by `tp_rank`."""
    if kind == "replicated":
        return full
    if kind == "vocab":
        if padded_rows is None:
            raise ValueError("vocab shards need padded_rows")
        pad = padded_rows - full.shape[0]
        if pad < 0:
            raise ValueError(f"vocabulary {full.shape[0]} is larger than the padded size {padded_rows}")
        full = torch.cat([full, full.new_zeros(pad, *full.shape[1:])]) if pad else full
        return full.chunk(tp, dim=0)[tp_rank]
    if kind in ("column", "qkv"):
        return full.chunk(tp, dim=0)[tp_rank]
    if kind == "row":
        return full.chunk(tp, dim=1)[tp_rank]
    if kind == "gate_up":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[tp_rank], up.chunk(tp, dim=0)[tp_rank]])
    raise ValueError(f"unknown parameter kind {kind!r}; known: {KINDS}")


def unshard(kind: str, shards: list[torch.Tensor], vocab_size: int | None = None) -> torch.Tensor:
    """Inverse of `shard`: the full tensor from every TP rank's shard (padding rows removed)."""
    if kind == "replicated":
        return shards[0]
    if kind == "vocab":
        if vocab_size is None:
            raise ValueError("vocab unshard needs vocab_size")
        return torch.cat(shards, dim=0)[:vocab_size]
    if kind in ("column", "qkv"):
        return torch.cat(shards, dim=0)
    if kind == "row":
        return torch.cat(shards, dim=1)
    if kind == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    raise ValueError(f"unknown parameter kind {kind!r}; known: {KINDS}")
