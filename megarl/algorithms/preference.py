"""Offline preference losses (DPO, IPO, ORPO, SimPO, KTO) as pure tensor functions.

Inputs are per-sequence log-probs of the response tokens: `sequence_logps` turns token log-probs
[N, R] and the response mask into their sum (DPO, IPO, KTO) or per-token mean (ORPO, SimPO). Every loss
returns per-pair (per-example for KTO) losses with gradients through the policy log-probs; the caller
reduces them (mean over pairs). "Rewards" are detached, for logging only.

DPO (Rafailov et al. 2023, "Direct Preference Optimization"): with h = (π_c − ref_c) − (π_r − ref_r),
loss = −logσ(βh); label smoothing ε (conservative DPO) assumes labels flip with probability ε:
−(1 − ε)·logσ(βh) − ε·logσ(−βh). Rewards are the implicit rewards β·(π − ref) of each response.

IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human Preferences"):
the squared loss (h − 1/(2τ))², τ = β, which regresses h to a finite margin instead of pushing it to ∞.
Rewards as DPO.

ORPO (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference Model"): on
length-normalised log-probs ḡ (per-token means), log odds(y) = ḡ − log(1 − exp(ḡ)) and
loss = −β·logσ(log odds_c − log odds_r), β being the paper's λ. The SFT (NLL) term on the chosen response
is the caller's. Rewards are β·ḡ.

SimPO (Meng et al. 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward"): the
reward is β·ḡ and loss = −logσ(β·ḡ_c − β·ḡ_r − γ), γ a target margin in reward units (TRL's
simpo_gamma); label smoothing as in cDPO. Rewards are β·ḡ.

KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization"): unpaired
examples, each desirable or not. With r = π − ref and the reference point z0 (`kto_ref_point`, the
batch's clamped KL estimate), a desirable example costs λ_D·(1 − σ(β(r − z0))), an undesirable one
λ_U·(1 − σ(β(z0 − r))). Rewards are β·r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from megarl.algorithms.aggregate import masked_mean


@dataclass(frozen=True)
class PairLoss:
    losses: torch.Tensor  # [P] per-pair loss; the caller reduces (mean over pairs)
    chosen_rewards: torch.Tensor  # [P] detached implicit rewards of the chosen responses
    rejected_rewards: torch.Tensor  # [P] detached, of the rejected responses


@dataclass(frozen=True)
class KTOLoss:
    losses: torch.Tensor  # [N] per-example weighted loss
    rewards: torch.Tensor  # [N] detached β·(π − ref)


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, average: bool = False) -> torch.Tensor:
    """[N, R] token log-probs -> [N]: their sum over the response tokens (mask 1), or with `average` their
    mean. Padding (mask 0) never reaches the result, even when it holds nan or inf; a row without tokens
    gives 0.
    """
    if average:
        return masked_mean(token_logps, mask, dim=-1)
    return torch.where(mask > 0, token_logps, 0.0).sum(dim=-1)


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> PairLoss:
    """DPO on sequence log-prob sums [P]: −(1 − ε)·logσ(βh) − ε·logσ(−βh) per pair, ε = label_smoothing
    in [0, 0.5), h = (π_c − ref_c) − (π_r − ref_r). Rewards: β·(π − ref) of each side."""
    _check_beta(beta)
    _check_label_smoothing(label_smoothing)
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    losses = _smoothed_logistic_loss(beta * (chosen_ratio - rejected_ratio), label_smoothing)
    return PairLoss(losses, (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach())


def ipo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
) -> PairLoss:
    """IPO: (h − 1/(2β))² per pair, h as in DPO, β the paper's τ. Rewards: β·(π − ref) of each side.

    h is built from whatever log-probs are passed: the paper's are sequence sums (`sequence_logps`);
    TRL's IPO averages per token instead (`average=True`), which changes the scale of h and so of β.
    """
    _check_beta(beta)
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    losses = (chosen_ratio - rejected_ratio - 1 / (2 * beta)) ** 2
    return PairLoss(losses, (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach())


def orpo_loss(
    chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor, beta: float
) -> tuple[PairLoss, torch.Tensor]:
    """ORPO's odds-ratio term on per-token mean log-probs ḡ [P] (< 0): −β·logσ(log odds_c − log odds_r)
    per pair, log odds = ḡ − log(1 − exp(ḡ)); add the NLL of the chosen responses yourself.

    Returns (PairLoss with rewards β·ḡ, the detached log odds ratio [P]). A mean log-prob of 0 (p = 1,
    infinite odds) counts as −tiny (the dtype's smallest normal number), so the loss stays finite.
    """
    _check_beta(beta)
    log_odds_ratio = _log_odds(chosen_mean_logps) - _log_odds(rejected_mean_logps)
    losses = -beta * F.logsigmoid(log_odds_ratio)
    pair = PairLoss(losses, (beta * chosen_mean_logps).detach(), (beta * rejected_mean_logps).detach())
    return pair, log_odds_ratio.detach()


def simpo_loss(
    chosen_mean_logps: torch.Tensor,
    rejected_mean_logps: torch.Tensor,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> PairLoss:
    """SimPO on per-token mean log-probs ḡ [P]: with z = β·ḡ_c − β·ḡ_r − γ, −(1 − ε)·logσ(z) − ε·logσ(−z)
    per pair; γ is the target margin in reward units. Rewards: β·ḡ of each side."""
    _check_beta(beta)
    _check_label_smoothing(label_smoothing)
    chosen_rewards, rejected_rewards = beta * chosen_mean_logps, beta * rejected_mean_logps
    losses = _smoothed_logistic_loss(chosen_rewards - rejected_rewards - gamma, label_smoothing)
    return PairLoss(losses, chosen_rewards.detach(), rejected_rewards.detach())


def kto_ref_point(kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0 = max(0, mean(π(y'|x) − ref(y'|x))), a detached scalar, from sequence
    log-probs of MISMATCHED (prompt, completion) pairs; 0 when there are none.

    The mean is over what is passed: under data parallelism gather the pairs of every rank first.
    """
    log_ratio = (kl_logps - ref_kl_logps).detach()
    return (log_ratio.sum() / max(log_ratio.numel(), 1)).clamp(min=0)


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    ref_point: torch.Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> KTOLoss:
    """KTO on sequence log-prob sums [N] with `desirable` (bool [N]) labels: r = π − ref and z0 =
    `ref_point` (a log-ratio, no gradient), per example λ_D·(1 − σ(β(r − z0))) if desirable, else
    λ_U·(1 − σ(β(z0 − r))). Rewards: β·r."""
    _check_beta(beta)
    for key, weight in (("desirable_weight", desirable_weight), ("undesirable_weight", undesirable_weight)):
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"preference.{key}={weight} must be a finite number >= 0")
    log_ratio = logps - ref_logps
    z0 = torch.as_tensor(ref_point, dtype=log_ratio.dtype, device=log_ratio.device).detach()
    desirable_losses = desirable_weight * (1 - torch.sigmoid(beta * (log_ratio - z0)))
    undesirable_losses = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - log_ratio)))
    losses = torch.where(desirable.to(torch.bool), desirable_losses, undesirable_losses)
    return KTOLoss(losses, (beta * log_ratio).detach())


def _smoothed_logistic_loss(z: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    # logsigmoid rather than log(sigmoid): finite (and linear) for large negative z
    loss = -F.logsigmoid(z)
    if label_smoothing:
        loss = (1 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-z)
    return loss


def _log_odds(mean_logps: torch.Tensor) -> torch.Tensor:
    # log(1 − p) as log(−expm1(ḡ)): near p = 1, 1 − exp(ḡ) rounds to 0 and its log to −inf
    bounded = mean_logps.clamp(max=-torch.finfo(mean_logps.dtype).tiny)
    return bounded - torch.log(-torch.expm1(bounded))


def _check_beta(beta: float) -> None:
    if not (beta > 0 and math.isfinite(beta)):
        raise ValueError(f"preference.beta={beta} must be a finite number > 0")


def _check_label_smoothing(label_smoothing: float) -> None:
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(
            f"preference.label_smoothing={label_smoothing} must be in [0, 0.5): at 0.5 the loss no "
            "longer prefers either response"
        )
