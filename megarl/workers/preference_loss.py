"""The actor's training loss for offline preference training, one micro-batch at a time.

A paired loss (dpo, ipo, orpo, simpo) needs both answers of a pair in the same micro-batch: the batch's
rows come interleaved (chosen0, rejected0, chosen1, …) and the micro-batches are cut in units of two
rows (`MegatronWorker.microbatches(group=2)`), so row 2i+1 of a micro-batch is the rejected answer of
row 2i. Each micro-batch returns its pairs' losses summed and divided by the batch's pair count (and
metrics the same way), which train_minibatches scales so that any DP/micro-batch split gives the
same loss and gradient.
"""

from __future__ import annotations

import torch

from megarl.algorithms.preference_terms import (
    BatchCounts,
    PreferenceSettings,
    interleaved_pair_terms,
    kto_terms,
    sequence_values,
)
from megarl.workers.log_probs import token_log_probs
from megarl.workers.train_loop import GlobalCounts, TrainLossFn

REF_LOGPS = "ref_logps"  # [n] the reference's sequence log-prob sum of each row (dpo, ipo, kto)
DESIRABLE = "desirable"  # [n] bool, kto


def check_whole_pairs(rows: torch.Tensor) -> None:
    """Raise unless a micro-batch's `rows` are whole interleaved pairs (2i, 2i+1, …)."""
    if len(rows) % 2 or not bool((rows[1::2] == rows[0::2] + 1).all()):
        raise RuntimeError(f"a preference micro-batch split a pair: rows {rows.tolist()}")


def preference_loss_fn(settings: PreferenceSettings, counts: BatchCounts, vocab_size: int) -> TrainLossFn:
    """train_minibatches' loss function for `settings` over a batch with `counts`."""

    def loss_fn(mb: dict, logits: torch.Tensor, _counts: GlobalCounts):
        token_logps, _ = token_log_probs(mb, logits, vocab_size)
        mask = mb["mask"]
        ref = mb[REF_LOGPS] if settings.uses_reference else None
        if settings.paired:
            check_whole_pairs(mb["rows"])
            losses, metrics = interleaved_pair_terms(settings, token_logps, mask, ref, counts)
        else:
            assert ref is not None  # KTO always uses the reference (settings.uses_reference)
            values = sequence_values(settings, token_logps, mask)
            losses, metrics = kto_terms(settings, values, ref.to(values.dtype), mb[DESIRABLE].bool(), counts)
        total = counts.items
        return losses.sum() / total, {k: v.sum() / total for k, v in metrics.items()}

    return loss_fn
