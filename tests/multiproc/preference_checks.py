"""Rank code for the preference-update checks of test_policy_workers (run inside policy_checks' launch).

`check_preference(actor, batch)` runs one optimizer step of every preference loss on the actor's
current weights, each preceded by a log-prob pass, and returns per loss the worker's loss and grad norm
next to what the pure functions (megarl.algorithms.preference_terms) give on those log-probs. The N
rows of the batch are N/2 pairs (rows 2i, 2i+1) or N KTO examples; the reference log-probs are fixed
numbers, the same at every layout.
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
from megarl.controller.group import WorkerGroup
from megarl.protocol import Batch

SETTINGS = (
    PreferenceSettings("dpo", beta=0.1, label_smoothing=0.1),
    PreferenceSettings("ipo", beta=0.5),
    PreferenceSettings("kto", beta=0.1, desirable_weight=1.0, undesirable_weight=1.5),
    PreferenceSettings("orpo", beta=0.2),
    PreferenceSettings("simpo", beta=2.0, simpo_gamma=0.5),
)
KTO_REF_POINT = 0.05


def _expected(s: PreferenceSettings, token_logps: torch.Tensor, mask: torch.Tensor, batch: Batch, counts):
    token_logps, mask = token_logps.double(), mask.double()
    ref = batch["ref_logps"].double()
    if s.name == "kto":
        values = sequence_values(s, token_logps, mask)
        losses, metrics = kto_terms(s, values, ref, batch["desirable"].bool(), counts)
    else:
        losses, metrics = interleaved_pair_terms(
            s, token_logps, mask, ref if s.uses_reference else None, counts
        )
    return losses.mean().item(), {k: v.mean().item() for k, v in metrics.items()}


def check_preference(actor: WorkerGroup, batch: Batch) -> dict:
    n = batch["input_ids"].shape[0]
    g = torch.Generator().manual_seed(7)
    mask = batch["response_mask"]
    columns = {
        "ref_logps": torch.randn(n, generator=g, dtype=torch.float64) * 2 - 30,
        "desirable": torch.tensor([i % 3 != 1 for i in range(n)]),
    }
    train = batch.union(Batch(tensors=columns))
    good = int(columns["desirable"].sum())
    out = {}
    for s in SETTINGS:
        if s.name == "kto":
            counts = BatchCounts(n, desirable=good, undesirable=n - good, ref_point=KTO_REF_POINT)
        else:
            counts = BatchCounts(n // 2, chosen_tokens=int(mask[0::2].sum()))
        token_logps = actor.log_prob(batch)["old_log_probs"]
        expected_loss, expected = _expected(s, token_logps, mask, train, counts)
        metrics = actor.preference_update(train, s, counts)[0]
        out[s.name] = {
            "loss": metrics["loss"],
            "expected_loss": expected_loss,
            "grad_norm": metrics["grad_norm"],
            "margin": metrics["rewards/margin"],
            "expected_margin": expected["rewards/margin"],
        }
    return out
