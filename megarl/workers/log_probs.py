"""Per-token log-probs (and entropy) of the responses under a policy of either backend: the code the actor and
the reference share.

Computed vocabulary-parallel (each TP rank keeps its slice of the logits; only per-token scalars are
all-reduced) on the last pipeline stage, then broadcast over PP.
"""

from __future__ import annotations

import torch

from megarl.models.forward import (
    vocab_parallel_entropy,
    vocab_parallel_log_probs,
    vocab_parallel_sum_pi_squared,
)
from megarl.protocol import Batch, Col
from megarl.workers.model_worker import ModelWorker
from megarl.workers.sequences import sequences_from_batch


def token_log_probs(
    mb: dict, logits: torch.Tensor, vocab_size: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of each response token under softmax(logits / temperature), those vocab-parallel scaled
    logits) — [k, R], [k, R, V/tp] — from the vocab-parallel logits at the response positions
    (`mb["index"]`)."""
    selected = logits / temperature if temperature != 1.0 else logits
    labels = mb["labels"].reshape(-1)[mb["index"].reshape(-1)].reshape(mb["index"].shape)
    return vocab_parallel_log_probs(selected, labels, vocab_size) * mb["mask"], selected


# per-token statistics of the policy's distribution a log-prob pass can also return, by column name
TOKEN_STATS = {"entropy": vocab_parallel_entropy, "sum_pi_squared": vocab_parallel_sum_pi_squared}


def response_log_probs(
    worker: ModelWorker,
    batch: Batch,
    column: str,
    stats: tuple[str, ...] = (),
    routes_to: str | None = None,
) -> Batch:
    """Batch(`column` [n, R]) of the worker's policy, plus each of `stats` (names in TOKEN_STATS) [n, R],
    0 on padding; with `routes_to` (an MoE role that replays routes) also the routers' live choices as
    that column [n, P+R, L, k] (megarl.workers.routes)."""
    seqs = sequences_from_batch(batch)
    width, vocab = seqs.response_width, worker.arch.vocab_size

    def compute(mb, logits):
        log_probs, selected = token_log_probs(mb, logits, vocab, worker.spec.temperature)
        out = {column: log_probs}
        for name in stats:
            out[name] = TOKEN_STATS[name](selected, vocab) * mb["mask"]
        return out

    shapes = {name: (width,) for name in (column, *stats)}
    routes: list[torch.Tensor] | None = [] if routes_to else None
    out = worker.forward_rows(seqs, compute, shapes, routes_out=routes)
    if routes is not None and routes_to:
        from megarl.workers.routes import routes_column

        out[routes_to] = routes_column(routes, batch[Col.ATTENTION_MASK])
    return Batch(tensors=out)
