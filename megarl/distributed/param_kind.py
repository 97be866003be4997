"""ParamKind: how one megatron parameter is laid out across tensor-parallel ranks (torch-free).

The one vocabulary of parameter layouts: the converter's name map (models/convert/llama.py) tags each
parameter with a kind, sharding.py splits and joins tensors by it, and the 3D-HybridEngine's plan and
reshard (distributed/generation_plan.py, hybrid/reshard.py) count and regroup bytes by it. It lives
beside the plan, below its users, so the pure plan needs neither torch nor the converter.
"""

from __future__ import annotations

from enum import StrEnum


class ParamKind(StrEnum):
    """A parameter's TP layout; a "full" tensor is what a TP=1 megatron model holds."""

    REPLICATED = "replicated"  # every TP rank holds the whole tensor (norms)
    COLUMN = "column"  # split along dim 0 (output features)
    ROW = "row"  # split along dim 1 (input features)
    # fused q/k/v grouped per query group: [g0: q.. k v | g1: q.. k v | ...]; TP splits whole groups, so
    # a plain dim-0 split is right (tp must divide the number of query groups)
    QKV = "qkv"
    # SwiGLU fc1 = [gate; up] *per TP shard*: shard i is [gate_i; up_i], not a slice of [gate; up]
    GATE_UP = "gate_up"
    VOCAB = "vocab"  # rows padded to the padded vocabulary, then split along dim 0

    @property
    def tp_sharded(self) -> bool:
        """Whether each TP rank holds a distinct 1/tp of the full tensor."""
        return self is not ParamKind.REPLICATED

    @classmethod
    def of(cls, kind: str) -> ParamKind:
        """`kind` as a ParamKind; a ValueError naming the known kinds when it is none of them."""
        try:
            return cls(kind)
        except ValueError:
            raise ValueError(f"unknown parameter kind {kind!r}; known: {', '.join(cls)}") from None
