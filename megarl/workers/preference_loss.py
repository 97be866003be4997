"""The actor's preference loss (offline training, or beside an RL update), one micro-batch at a time.

A paired loss (dpo, ipo, orpo, simpo) needs both answers of a pair in the same micro-batch: the batch's
rows come interleaved (chosen0, rejected0, chosen1, …) and the micro-batches are cut in units of two
rows (`ModelWorker.microbatches(group=2)`), so row 2i+1 of a micro-batch is the rejected answer of
row 2i. Each micro-batch returns its pairs' losses summed and divided by the batch's pair count (and
metrics the same way), which train_minibatches scales so that any DP/micro-batch split gives the
same loss and gradient.

A `weight` multiplies the loss that is backpropagated, so its gradient, not the learning rate: a
preference update beside an RL update (megarl.trainer.preference_stage) counts for `weight` of its own.
The `loss` metric is what was backpropagated; `unweighted_loss` is the preference loss itself.
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


def preference_loss_fn(
    settings: PreferenceSettings,
    counts: BatchCounts,
    vocab_size: int,
    weight: float = 1.0,
    temperature: float = 1.0,
) -> TrainLossFn:
    """train_minibatches' loss function for `settings` over a batch with `counts`: `weight` × the loss
    of the policy's log-probs of softmax(logits / `temperature`) (the reference's are of the same)."""

    def loss_fn(mb: dict, logits: torch.Tensor, _counts: GlobalCounts):
        token_logps, _ = token_log_probs(mb, logits, vocab_size, temperature)
        return micro_batch_loss(settings, counts, mb, token_logps, weight)

    return loss_fn


def micro_batch_loss(
    settings: PreferenceSettings,
    counts: BatchCounts,
    mb: dict,
    token_logps: torch.Tensor,
    weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(this micro-batch's share of `weight` × the batch's preference loss, its shares of the metrics and
    of the unweighted loss) from the policy's token log-probs [k, R] of its rows."""
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
    loss = losses.sum() / total
    out = {k: v.sum() / total for k, v in metrics.items()}
    out["unweighted_loss"] = loss.detach()
    return weight * loss, out
