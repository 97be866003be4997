"""One preference loss, chosen by name, over the sequence log-probs of a set of pairs (or KTO examples):
the per-item losses and the metrics, shared by the actor's training micro-batches and the driver's
evaluation, so both compute exactly the same thing.

Every value is per item ([P] pairs, [N] KTO examples) and is reduced by the caller as Σ / (batch count),
which makes the loss of a batch independent of how it is split over data-parallel ranks and
micro-batches. ORPO's NLL term is token-mean over all chosen tokens of the batch: each pair carries its
chosen tokens' NLL sum × P / (chosen tokens), so the mean over pairs is that token mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megarl.algorithms import preference as pref

PAIRED = ("dpo", "ipo", "orpo", "simpo")
LENGTH_NORMALISED = ("orpo", "simpo")  # their log-probs are per-token means of the response
DEFAULT_BETA = {"simpo": 2.0}  # else 0.1 (TRL's defaults; the SimPO paper's range is 2–2.5)


@dataclass(frozen=True)
class PreferenceSettings:
    """The loss and its parameters (`algorithm.name`, `preference.*`, resolved)."""

    name: str
    beta: float
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    @classmethod
    def from_config(cls, cfg) -> PreferenceSettings:
        """The settings of `cfg.algorithm.name`; preference.beta=None is that loss's default."""
        p, name = cfg.preference, cfg.algorithm.name
        return cls(
            name,
            p.beta if p.beta is not None else DEFAULT_BETA.get(name, 0.1),
            p.label_smoothing,
            p.simpo_gamma,
            p.desirable_weight,
            p.undesirable_weight,
        )

    @property
    def paired(self) -> bool:
        return self.name in PAIRED

    @property
    def uses_reference(self) -> bool:
        return self.name not in LENGTH_NORMALISED


@dataclass(frozen=True)
class BatchCounts:
    """Denominators over the WHOLE batch (all ranks, all micro-batches), known to the driver."""

    items: int  # pairs (paired losses) or examples (KTO)
    chosen_tokens: int = 0  # orpo's NLL: response tokens of the chosen answers
    desirable: int = 0  # kto: desirable examples
    undesirable: int = 0  # kto: undesirable examples
    ref_point: float = 0.0  # kto: the reference point z0 of this batch (kto_ref_point)


def sequence_values(s: PreferenceSettings, token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[n] per-sequence log-prob the loss uses: the sum, or the per-token mean for orpo/simpo."""
    return pref.sequence_logps(token_logps, mask, average=s.name in LENGTH_NORMALISED)


def pair_terms(
    s: PreferenceSettings,
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    counts: BatchCounts,
    chosen_nll_sums: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(per-pair losses [P], per-pair metrics {name: [P]}) whose means over the batch's pairs are the
    batch loss and metrics. `chosen_nll_sums` ([P], orpo only): −Σ log p of each chosen response."""
    if s.name == "dpo":
        out = pref.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, s.beta, s.label_smoothing)
    elif s.name == "ipo":
        out = pref.ipo_loss(chosen, rejected, ref_chosen, ref_rejected, s.beta)
    elif s.name == "simpo":
        out = pref.simpo_loss(chosen, rejected, s.beta, s.simpo_gamma, s.label_smoothing)
    elif s.name == "orpo":
        out, log_odds = pref.orpo_loss(chosen, rejected, s.beta)
    else:
        raise ValueError(f"{s.name!r} is not a paired preference loss; use one of {', '.join(PAIRED)}")
    losses = out.losses
    metrics = {
        "rewards/chosen": out.chosen_rewards,
        "rewards/rejected": out.rejected_rewards,
        "rewards/margin": out.chosen_rewards - out.rejected_rewards,
        "rewards/accuracy": (out.chosen_rewards > out.rejected_rewards).to(chosen.dtype),
        "logps/chosen": chosen.detach(),
        "logps/rejected": rejected.detach(),
    }
    if s.name == "orpo":
        if chosen_nll_sums is None or not counts.chosen_tokens:
            raise ValueError("orpo needs the chosen responses' NLL sums and the batch's chosen token count")
        nll = chosen_nll_sums * (counts.items / counts.chosen_tokens)
        metrics["orpo/odds_ratio_loss"] = losses.detach()
        metrics["orpo/nll_loss"] = nll.detach()
        metrics["orpo/log_odds_ratio"] = log_odds
        losses = losses + nll
    return losses, metrics


def interleaved_pair_terms(
    s: PreferenceSettings,
    token_logps: torch.Tensor,
    mask: torch.Tensor,
    ref_sums: torch.Tensor | None,
    counts: BatchCounts,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`pair_terms` of rows laid out as the batches are (chosen0, rejected0, chosen1, …): token log-probs
    [2P, R] with their mask, and the reference's sequence log-prob sums [2P] (None for orpo/simpo)."""
    values = sequence_values(s, token_logps, mask)
    ref = None if ref_sums is None else ref_sums.to(values.dtype)
    nll = -(token_logps[0::2] * mask[0::2]).sum(-1) if s.name == "orpo" else None
    return pair_terms(
        s,
        values[0::2],
        values[1::2],
        None if ref is None else ref[0::2],
        None if ref is None else ref[1::2],
        counts,
        nll,
    )


def kto_terms(
    s: PreferenceSettings,
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    counts: BatchCounts,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(per-example losses [N], per-example metric shares {name: [N]}) whose sums over the batch divided
    by counts.items give the loss; the metric shares already carry their own denominators (desirable or
    undesirable examples), so summing them over the batch gives the batch value."""
    out = pref.kto_loss(
        logps, ref_logps, desirable, counts.ref_point, s.beta, s.desirable_weight, s.undesirable_weight
    )
    good, bad = desirable.to(logps.dtype), (~desirable).to(logps.dtype)
    n, metrics = counts.items, {}
    # a side the batch has no example of has no mean: its metrics (and the margin) are left out
    per_good = good * n / counts.desirable if counts.desirable else None
    per_bad = bad * n / counts.undesirable if counts.undesirable else None
    if per_good is not None:
        metrics["rewards/chosen"] = out.rewards * per_good
        metrics["logps/chosen"] = logps.detach() * per_good
    if per_bad is not None:
        metrics["rewards/rejected"] = out.rewards * per_bad
        metrics["logps/rejected"] = logps.detach() * per_bad
    if per_good is not None and per_bad is not None:
        metrics["rewards/margin"] = out.rewards * (per_good - per_bad)
    return out.losses, metrics
