"""The work of one RL step's stages, counted from a decoder's config and the step's token counts.

Pure arithmetic (no torch): each stage's GEMM FLOPs per matrix shape, causal attention FLOPs (each
query attends to itself and the tokens before it: the work a causal kernel or a KV-cache decode does,
about half the L² a dense attention matmul counts) and the bytes a stage must move at least (weights
per pass, the KV cache each decode step reads, gradients and Adam's state). `megarl bench roofline`
turns them into floors with the machine's measured rates; the GPU script reuses them for MFU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FP32 = 4
ADAM_BYTES_PER_PARAM = 7 * FP32  # read parameter, gradient, both moments; write parameter, both moments


@dataclass(frozen=True)
class Decoder:
    """A Llama/Qwen-style decoder: GQA attention, SwiGLU MLP, untied or tied LM head."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False

    @classmethod
    def from_hf(cls, config) -> Decoder:
        """From a transformers config (or anything with its field names)."""
        heads = config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            ffn=config.intermediate_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab=config.vocab_size,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
        )

    def gemms(self) -> dict[str, tuple[int, int, int]]:
        """Each weight GEMM of a forward pass as name -> (k, n, times per token): x[·, k] @ W[k, n]."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "qkv": (self.hidden, q + 2 * kv, self.layers),
            "o": (q, self.hidden, self.layers),
            "gate_up": (self.hidden, 2 * self.ffn, self.layers),
            "down": (self.ffn, self.hidden, self.layers),
            "lm_head": (self.hidden, self.vocab, 1),
        }

    def matrix_params(self) -> int:
        """Parameters the GEMMs read (the LM head's included, the embedding gather not)."""
        return sum(k * n * times for k, n, times in self.gemms().values())

    def params(self) -> int:
        """All parameters: the matrices, the embedding unless tied, the norms."""
        embedding = 0 if self.tied else self.vocab * self.hidden
        return self.matrix_params() + embedding + (2 * self.layers + 1) * self.hidden

    def kv_bytes_per_token(self) -> int:
        """The KV cache one context token holds over all layers (fp32)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * FP32

    def attention_flops(self, length: int, context: int = 0) -> int:
        """Forward QKᵀ and AV FLOPs, all layers, for `length` new tokens after `context` cached ones, causal."""
        attended = length * context + length * (length + 1) // 2  # Σ over queries of the keys they see
        return 2 * 2 * self.layers * self.heads * self.head_dim * attended


@dataclass(frozen=True)
class Sequences:
    """A step's sequences: how many, and their mean prompt and response lengths in tokens.

    The GEMM work is linear in the tokens, so the means count it exactly; attention's Σ L² is taken at
    the mean length (at these lengths attention is ~2% of the FLOPs, the spread's effect on it ~1e-4)."""

    count: int
    prompt: float
    response: float
    response_max: int
    ranks: int = 2  # data-parallel ranks sharing the update, and generation engines sharing the rollouts

    @property
    def length(self) -> float:
        return self.prompt + self.response


@dataclass
class Phase:
    """Work with one bottleneck: FLOPs per GEMM shape (m, k, n) and other FLOPs, bytes moved."""

    gemm_flops: dict[tuple[int, int, int], float] = field(default_factory=dict)
    other_flops: float = 0.0  # attention
    bytes: float = 0.0

    @property
    def flops(self) -> float:
        return sum(self.gemm_flops.values()) + self.other_flops

    def add_gemm(self, m: int, k: int, n: int, flops: float) -> None:
        self.gemm_flops[(m, k, n)] = self.gemm_flops.get((m, k, n), 0.0) + flops


def _forward(model: Decoder, phase: Phase, tokens: float, rows: int, passes: tuple[str, ...]) -> None:
    """Add `tokens` tokens' GEMMs (in micro-batches of `rows` rows) for each of `passes`: fwd (x·W),
    dgrad (dy·Wᵀ), wgrad (xᵀ·dy)."""
    shapes = {
        "fwd": lambda k, n: (rows, k, n),
        "dgrad": lambda k, n: (rows, n, k),
        "wgrad": lambda k, n: (k, rows, n),
    }
    for k, n, times in model.gemms().values():
        for p in passes:
            phase.add_gemm(*shapes[p](k, n), 2.0 * tokens * k * n * times)


def update_phases(model: Decoder, seqs: Sequences) -> dict[str, Phase]:
    """One policy update over the step's sequences (one micro-batch per rank, plain data parallel):
    forward + backward (2× the forward), then the gradient all-reduce and Adam on every rank."""
    tokens = seqs.count * seqs.length
    rows = math.ceil(tokens / seqs.ranks)
    compute = Phase()
    _forward(model, compute, tokens, rows, ("fwd", "dgrad", "wgrad"))
    compute.other_flops = 3.0 * seqs.count * model.attention_flops(round(seqs.length))
    # each rank reads its weights in each of the three passes and writes its gradients
    compute.bytes = seqs.ranks * 4 * model.matrix_params() * FP32
    # all-reduce (read + write the gradients) and Adam, every rank over the whole model
    optimizer = Phase(bytes=seqs.ranks * model.params() * (2 * FP32 + ADAM_BYTES_PER_PARAM))
    return {"forward_backward": compute, "optimizer": optimizer}


def log_prob_phases(model: Decoder, seqs: Sequences) -> dict[str, Phase]:
    """A forward pass over the step's sequences (old or reference log-probs)."""
    tokens = seqs.count * seqs.length
    phase = Phase(bytes=seqs.ranks * model.matrix_params() * FP32)
    _forward(model, phase, tokens, math.ceil(tokens / seqs.ranks), ("fwd",))
    phase.other_flops = seqs.count * model.attention_flops(round(seqs.length))
    return {"forward": phase}


def generation_phases(model: Decoder, seqs: Sequences) -> dict[str, Phase]:
    """Rollouts on `seqs.ranks` engines, each batching its share of the sequences: a prefill of the
    prompts, then one decode step per generated token after the first, each reading the engine's weights
    and every running sequence's KV cache."""
    per_engine = math.ceil(seqs.count / seqs.ranks)
    prompt = round(seqs.prompt)
    prefill = Phase(bytes=seqs.ranks * model.matrix_params() * FP32)
    _forward(model, prefill, seqs.count * seqs.prompt, per_engine * prompt, ("fwd",))
    prefill.other_flops = seqs.count * model.attention_flops(prompt)
    decoded = seqs.response - 1  # the prefill's logits give each response its first token
    decode = Phase()
    _forward(model, decode, seqs.count * decoded, per_engine, ("fwd",))
    decode.other_flops = seqs.count * (
        model.attention_flops(round(seqs.length) - 1) - model.attention_flops(prompt)
    )
    steps = seqs.response_max - 1  # an engine steps until its longest response ends
    context = decoded * seqs.prompt + decoded * (decoded + 1) / 2  # Σ over decoded tokens of the keys read
    decode.bytes = (
        seqs.ranks * steps * model.matrix_params() * FP32 + seqs.count * context * model.kv_bytes_per_token()
    )
    return {"prefill": prefill, "decode": decode}


def transition_phases(model: Decoder, seqs: Sequences) -> dict[str, Phase]:
    """The weight sync into each rank's engine: every parameter read once and written once."""
    return {"sync": Phase(bytes=seqs.ranks * 2 * model.params() * FP32)}


STAGE_PHASES = {
    "generation": generation_phases,
    "log_probs": log_prob_phases,
    "update": update_phases,
    "transition": transition_phases,
}
