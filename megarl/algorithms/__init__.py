"""RL estimators and losses as pure tensor functions (no torch.distributed, no Megatron).

`aggregate` reduces token tensors to a loss, `advantages` turns rewards into advantages, `kl` measures
and controls KL to the reference, `policy_loss` / `value_loss` are the actor's and critic's objectives.
"""

from megarl.algorithms.advantages import ESTIMATORS, compute_advantages, scores_to_token_rewards
from megarl.algorithms.aggregate import LOSS_AGG_MODES, aggregate, masked_mean, masked_var, masked_whiten
from megarl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_penalty,
)
from megarl.algorithms.policy_loss import POLICY_LOSSES, entropy_bonus, gspo_loss, ppo_clip_loss
from megarl.algorithms.value_loss import clipped_value_loss

__all__ = [
    "ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "aggregate",
    "apply_kl_penalty",
    "build_kl_controller",
    "clipped_value_loss",
    "compute_advantages",
    "entropy_bonus",
    "gspo_loss",
    "kl_penalty",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "ppo_clip_loss",
    "scores_to_token_rewards",
]
