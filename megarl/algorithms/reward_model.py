"""The reward model's Bradley–Terry loss, a pure tensor function.

Bradley–Terry (1952; as InstructGPT, Ouyang et al. 2022, trains its reward model): the probability that
the chosen response beats the rejected one is σ(r_c − r_r), so each pair costs −log σ(r_c − r_r − m),
m an optional margin the chosen score must clear (Llama 2's margin loss; 0 = the plain loss).
The metrics are per pair and detached: `accuracy` 1 where r_c > r_r (a tie counts as wrong), `margin`
r_c − r_r, and the two scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: float | torch.Tensor = 0.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """[P] scores of the chosen and rejected responses -> ([P] per-pair losses with gradients through
    both scores, {accuracy, margin, chosen, rejected}: [P] detached metrics). The caller reduces
    (mean over pairs)."""
    if chosen.shape != rejected.shape:
        raise ValueError(
            f"chosen {tuple(chosen.shape)} and rejected {tuple(rejected.shape)} scores differ in shape"
        )
    diff = chosen - rejected
    losses = -F.logsigmoid(diff - margin)
    d = diff.detach()
    metrics = {
        "accuracy": (d > 0).to(d.dtype),
        "margin": d,
        "chosen": chosen.detach(),
        "rejected": rejected.detach(),
    }
    return losses, metrics
