"""The actor's RL objective for one micro-batch, from the policy's token log-probs: the policy loss of
`algorithm.policy_loss`, minus the entropy bonus, plus the KL loss — all over the tokens of the
micro-batch's `mask` (the batch's response_mask: generated tokens only, never a multi-turn rollout's tool
outputs or user turns) and normalised by the mini-batch's global counts (megarl.workers.train_loop).

A pure function of tensors, so that what the loss sees can be tested without a model or a process group;
`ActorRole._policy_loss` runs it on the model's output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from megarl.algorithms.aggregate import aggregate
from megarl.algorithms.kl import kl_penalty
from megarl.algorithms.loss_traits import LOSS_PARAMS
from megarl.algorithms.policy_loss import POLICY_LOSSES, entropy_bonus
from megarl.config.schema import AlgorithmConfig
from megarl.protocol import Col
from megarl.workers.train_loop import GlobalCounts


def policy_objective(
    algo: AlgorithmConfig,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mb: Mapping[str, torch.Tensor],
    counts: GlobalCounts,
    entropy: Callable[[], torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(this micro-batch's share of the mini-batch loss, its metrics weighted to sum over micro-batches).

    `log_probs` [k, R] (with grad) and `old_log_probs` are the sampled tokens' log-probs; `mb` holds
    `mask`, `advantages` and, as the config asks, `ref_log_probs` and `rollout_is_weights`. `entropy()`
    gives the tokens' entropy [k, R] (called only when algorithm.entropy_coeff is set); `generator`:
    clip_cov's random token pick.
    """
    assert algo.loss_agg_mode is not None  # a role spec is built from the resolved config
    mask = mb["mask"]
    agg = {"agg_mode": algo.loss_agg_mode, **counts.agg()}
    own: dict = {**LOSS_PARAMS[algo.policy_loss], **algo.policy_loss_params}
    if generator is not None:
        own["generator"] = generator
    loss, metrics = POLICY_LOSSES[algo.policy_loss](
        log_probs,
        old_log_probs,
        mb[Col.ADVANTAGES],
        mask,
        algo.clip_ratio_low,
        algo.clip_ratio_high,
        clip_ratio_c=algo.clip_ratio_c,
        rollout_is_weights=mb.get(Col.ROLLOUT_IS_WEIGHTS),
        **own,
        **agg,
    )
    # Metrics are token means over this micro-batch; weight them by its share of the mini-batch tokens.
    share = mask.sum() / counts.num_tokens
    out = {f"actor/{k}": torch.as_tensor(v, dtype=torch.float64) * share for k, v in metrics.items()}
    out["actor/pg_loss"] = loss.detach()
    if algo.entropy_coeff:
        if entropy is None:
            raise ValueError("algorithm.entropy_coeff is set: the policy objective needs the tokens' entropy")
        tokens_entropy = entropy()
        loss = loss - entropy_bonus(tokens_entropy, mask, algo.entropy_coeff, **agg)
        out["actor/entropy"] = aggregate(
            tokens_entropy.detach(), mask, "token-mean", num_tokens=counts.num_tokens
        )
    if algo.use_kl_loss:
        kl = kl_penalty(log_probs, mb[Col.REF_LOG_PROBS], algo.kl_loss_type)
        kl = aggregate(kl, mask, algo.loss_agg_mode, **counts.agg())
        loss = loss + algo.kl_loss_coef * kl
        out["actor/kl_loss"] = kl.detach()
    return loss, out
