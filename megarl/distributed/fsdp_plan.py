"""Where an FSDP actor's weights must go for its colocated vLLM engine, and the bytes that takes (pure).

FSDP2 (`fully_shard` over a 1-D mesh of the whole world, placement Shard(0)) gives rank r of w the rows
`torch.chunk(full, w)[r]` of dim 0 of every parameter: ceil(n/w) rows each, the last ranks fewer or none.
The engine runs at TP t_g with generation TP groups of t_g consecutive ranks (rank r: generation TP rank
r % t_g, generation replica r // t_g), and each engine TP rank reads one region of every HF tensor, as
vLLM's layers shard it (`engine_region`):

  q_proj, gate_proj, up_proj  column-parallel: rows g·n/t_g ..; their biases the same rows
  k_proj, v_proj              column-parallel over key/value heads; with t_g > num_key_value_heads each
                              head is replicated on t_g/num_key_value_heads ranks (vLLM's QKVParallelLinear)
  o_proj, down_proj           row-parallel: columns g·n/t_g ..; their biases whole
  embed_tokens, lm_head       vocab-parallel: vLLM pads the vocabulary to a multiple of 64, splits the
                              padded rows evenly, and loads only the real rows of each slice
  norms (and q_norm, k_norm)  replicated: whole

What rank r receives for one parameter: its region less the part of it among its own FSDP rows
(`received_bytes`); any schedule that sends each rank only bytes it lacks, once, moves exactly that, and
`megarl.fsdp.weight_sync` does (rank s sends rank r `piece(s → r)`). At t_g = 1 every rank needs every
tensor whole, for any architecture: (w−1)/w of the model, the same as a full all-gather. At t_g > 1 the
regions follow the table above, known for the model types in `ENGINE_SHARDED_MODEL_TYPES`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from megarl.distributed.layout import LayoutError, divisors

if TYPE_CHECKING:
    import torch

# vLLM 0.32's model files for these model types build every layer from QKVParallelLinear,
# MergedColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding / ParallelLMHead and replicated
# norms, under the HF parameter names: the regions above are theirs.
ENGINE_SHARDED_MODEL_TYPES = ("gemma2", "gemma3_text", "llama", "mistral", "qwen2", "qwen3")
VOCAB_PADDING = 64  # vllm.model_executor.layers.vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE

_KIND_OF_MODULE = {
    "q_proj": "column",
    "gate_proj": "column",
    "up_proj": "column",
    "k_proj": "kv",
    "v_proj": "kv",
    "o_proj": "row",
    "down_proj": "row",
    "embed_tokens": "vocab",
    "lm_head": "vocab",
}
# The engine layer each HF module is part of: the parts of one engine layer travel in one bucket.
ENGINE_LAYER_OF_MODULE = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}


@dataclass(frozen=True)
class Region:
    """A box of a full tensor: rows [rows[0], rows[1]) of dim 0 and, where `cols` is set, only columns
    [cols[0], cols[1]) of dim 1 (all of them otherwise)."""

    rows: tuple[int, int]
    cols: tuple[int, int] | None = None

    @staticmethod
    def whole(shape: Sequence[int]) -> Region:
        return Region((0, shape[0] if shape else 1))

    def numel(self, shape: Sequence[int]) -> int:
        """Elements of the box in a tensor of `shape`."""
        if not shape:
            return 1 if self.rows[1] > self.rows[0] else 0
        per_row = math.prod(shape[1:])
        if self.cols is not None:
            per_row = per_row // shape[1] * (self.cols[1] - self.cols[0])
        return max(0, self.rows[1] - self.rows[0]) * per_row

    def within_rows(self, lo: int, hi: int) -> Region | None:
        """The part of the box inside rows [lo, hi), or None where it is empty."""
        start, stop = max(self.rows[0], lo), min(self.rows[1], hi)
        return Region((start, stop), self.cols) if start < stop else None


def pad_vocab(vocab_size: int) -> int:
    """The vocabulary size vLLM allocates: `vocab_size` rounded up to a multiple of 64."""
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING


@dataclass(frozen=True)
class FSDPGenerationPlan:
    """The generation layout of an FSDP actor over `world_size` ranks at generation TP `gen_tp`, and what
    each rank receives to fill its engine. Build it with `for_hf_config(hf_config, world_size, gen_tp)`;
    `model_type` and the head counts are needed at gen_tp > 1 only."""

    world_size: int
    gen_tp: int
    model_type: str | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        problems = FSDPGenerationPlan.check(
            self.world_size, self.gen_tp, self.model_type, self.num_heads, self.num_kv_heads, self.vocab_size
        )
        if problems:
            raise LayoutError(problems)

    @classmethod
    def for_hf_config(cls, hf_config: Mapping[str, Any], world_size: int, gen_tp: int) -> FSDPGenerationPlan:
        """The plan for a model of HF config `hf_config` (config.json's dict) trained on `world_size` ranks."""
        return cls(world_size, gen_tp, *model_fields(hf_config))

    @staticmethod
    def check(
        world_size: int,
        gen_tp: int,
        model_type: str | None = None,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        vocab_size: int | None = None,
        gen_key: str = "rollout.tp",
    ) -> list[str]:
        """Every rule generation TP `gen_tp` over an FSDP actor of `world_size` ranks must obey, as problem
        lines naming `gen_key`."""
        if gen_tp < 1:
            return [f"{gen_key}={gen_tp} must be ≥ 1; e.g. 1"]
        problems = []
        if world_size % gen_tp:
            problems.append(
                f"{gen_key}={gen_tp} does not divide the FSDP actor's world of {world_size} ranks (each "
                f"generation replica is a run of {gen_key} consecutive ranks); use one of "
                f"{', '.join(map(str, divisors(world_size)))}"
            )
        if gen_tp == 1:
            return problems
        if model_type not in ENGINE_SHARDED_MODEL_TYPES:
            problems.append(
                f"{gen_key}={gen_tp} > 1 with an FSDP actor needs the engine's sharding of "
                f"{model_type or 'this model (no model_type given)'}; megarl knows it for "
                f"{', '.join(ENGINE_SHARDED_MODEL_TYPES)}; use {gen_key}=1"
            )
            return problems
        if num_heads is None or num_kv_heads is None:
            problems.append(
                f"{gen_key}={gen_tp} > 1 needs the model's num_attention_heads and num_key_value_heads; "
                "pass the model's HF config"
            )
            return problems
        if num_heads % gen_tp:
            fits = ", ".join(map(str, divisors(math.gcd(num_heads, world_size))))
            problems.append(
                f"{gen_key}={gen_tp} does not divide num_attention_heads={num_heads} (vLLM splits the "
                f"query heads evenly over its TP ranks); use one of {fits}"
            )
        if (gen_tp % num_kv_heads if gen_tp >= num_kv_heads else num_kv_heads % gen_tp) != 0:
            problems.append(
                f"{gen_key}={gen_tp} and num_key_value_heads={num_kv_heads}: vLLM needs one to divide the "
                f"other (it splits key/value heads over its TP ranks, or replicates each on "
                f"{gen_key}/num_key_value_heads ranks)"
            )
        if vocab_size is not None and pad_vocab(vocab_size) % gen_tp:
            problems.append(
                f"{gen_key}={gen_tp} does not divide vLLM's padded vocabulary of {pad_vocab(vocab_size)} "
                f"rows (vocab_size={vocab_size} rounded up to a multiple of {VOCAB_PADDING}); use one of "
                f"{', '.join(map(str, divisors(math.gcd(pad_vocab(vocab_size), world_size))))}"
            )
        return problems

    # ---- the generation layout ----------------------------------------------------------------------

    @property
    def gen_dp_size(self) -> int:
        """Generation replicas in the world (world / t_g): the prompt batch is split this many ways."""
        return self.world_size // self.gen_tp

    def gen_tp_rank(self, rank: int) -> int:
        """Which generation TP shard `rank` holds."""
        return rank % self.gen_tp

    def gen_dp_rank(self, rank: int) -> int:
        """Which generation replica `rank` belongs to, i.e. which prompt chunk it serves."""
        return rank // self.gen_tp

    def gen_tp_group(self, rank: int) -> list[int]:
        """The ranks of `rank`'s generation replica, in generation TP order."""
        return self.gen_tp_groups[self.gen_dp_rank(rank)]

    @cached_property
    def gen_tp_groups(self) -> list[list[int]]:
        """Every generation replica's ranks; entry i is replica i: runs of t_g consecutive ranks."""
        t = self.gen_tp
        return [list(range(i * t, (i + 1) * t)) for i in range(self.gen_dp_size)]

    # ---- what is held, what is needed ---------------------------------------------------------------

    def fsdp_rows(self, rank: int, rows: int) -> tuple[int, int]:
        """The rows [lo, hi) of a parameter with `rows` rows in dim 0 that FSDP2 gives `rank`
        (torch.chunk's split: ceil(rows/world) each, the last ranks fewer or none)."""
        size = -(-rows // self.world_size)
        lo = min(rank * size, rows)
        return lo, min(lo + size, rows)

    def engine_region(self, name: str, full_shape: Sequence[int], rank: int) -> Region:
        """The region of HF tensor `name` (full shape `full_shape`) that `rank`'s engine TP shard reads."""
        whole = Region.whole(full_shape)
        if self.gen_tp == 1 or not full_shape:
            return whole
        g, t = self.gen_tp_rank(rank), self.gen_tp
        module, _, param = name.rpartition(".")
        leaf = module.rpartition(".")[2]
        kind = _KIND_OF_MODULE.get(leaf)
        if kind is None:
            if "norm" in leaf:
                return whole
            raise ValueError(
                f"{name}: no engine sharding rule for module {leaf!r} of a {self.model_type} model; "
                "use rollout.tp=1"
            )
        n = full_shape[0]
        if kind == "row":
            if param == "bias":
                return whole
            width = _split(full_shape[1], t, name)
            return Region((0, n), (g * width, (g + 1) * width))
        if kind == "vocab":
            per = _split(pad_vocab(n), t, name)
            return Region((min(g * per, n), min((g + 1) * per, n)))
        if kind == "kv" and t >= (self.num_kv_heads or 0):
            kv = self.num_kv_heads or 1
            head = _split(n, kv, name)
            shard = g // (t // kv)
            return Region((shard * head, (shard + 1) * head))
        rows = _split(n, t, name)
        return Region((g * rows, (g + 1) * rows))

    def piece(self, name: str, full_shape: Sequence[int], source: int, dest: int) -> Region | None:
        """What `source` holds of `dest`'s engine region of `name` (None: nothing): what it sends `dest`."""
        rows = full_shape[0] if full_shape else 1
        return self.engine_region(name, full_shape, dest).within_rows(*self.fsdp_rows(source, rows))

    def received_bytes(
        self, name: str, full_shape: Sequence[int], dtype: torch.dtype, rank: int, sharded: bool = True
    ) -> int:
        """Bytes `rank` must receive to fill its engine region of HF parameter `name`: the region less
        the part of it in its own FSDP rows (all of it where the parameter is not `sharded`)."""
        if not sharded:
            return 0
        region = self.engine_region(name, full_shape, rank)
        held = self.piece(name, full_shape, rank, rank)
        missing = region.numel(full_shape) - (held.numel(full_shape) if held else 0)
        return missing * dtype.itemsize

    def naive_bytes(self, model_bytes: float) -> float:
        """Bytes each rank receives when it all-gathers every full tensor: (w−1)/w·M (evenly chunked)."""
        return model_bytes * (self.world_size - 1) / self.world_size


def check_fsdp_rollout_tp(hf_config: Mapping[str, Any], gen_tp: int, world_size: int) -> None:
    """Raise LayoutError (each problem with its fix) unless an FSDP actor of HF config `hf_config` on
    `world_size` ranks can feed a colocated engine at rollout.tp=`gen_tp`. Call it at load time."""
    problems = FSDPGenerationPlan.check(world_size, gen_tp, *model_fields(hf_config))
    if problems:
        raise LayoutError(problems)


def model_fields(hf_config: Mapping[str, Any]) -> tuple[str | None, int | None, int | None, int | None]:
    heads = hf_config.get("num_attention_heads")
    return (
        hf_config.get("model_type"),
        heads,
        hf_config.get("num_key_value_heads") or heads,
        hf_config.get("vocab_size"),
    )


def _split(n: int, parts: int, name: str) -> int:
    if n % parts:
        raise ValueError(f"{name}: {n} rows or columns do not split into {parts} equal engine TP shards")
    return n // parts
