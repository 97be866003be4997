"""MoE settings of a trained role: rollout routing replay (`actor.router_replay`, verl's names and modes;
the rules: megarl.config.moe_checks; the mechanism: megarl.models.moe_replay) and the router's
load-balancing losses (`<role>.moe`, megatron's names).

With identical weights an MoE router in the trainer and one in the rollout engine still send some tokens
to other experts (different kernels, different sums), so the trainer's log-probs are not the ones the
samples were drawn from. Replaying routes makes the trainer's forwards take the experts given; the
gating weights are recomputed from the trainer's own router logits at those experts, so the router
still trains. A token without a route (-1) is routed live.

The engine's own expert parallelism is `rollout.expert_parallel_size` (verl's key, in RolloutConfig): 1, or
= rollout.tp for vLLM's enable_expert_parallel, where engine TP rank j holds the j-th contiguous block of
whole experts (dense layers stay TP-sharded) and the weight sync sends it that block only, point to point
(megarl.hybrid.reshard). Megatron actor, colocated engine only; the rules: megarl.config.moe_checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config.options import MoeLoadBalancing, RouterReplayMode


@dataclass
class RouterReplayConfig:
    # verl's actor_rollout_ref.actor.router_replay.mode:
    #   "disabled": every forward routes live
    #   "R2": the old-log-prob forward after the rollout records its routes; the update's forwards replay
    #         them (the policy ratio compares forwards with the same experts)
    #   "R3": the rollout engine returns each token's experts (rollout routing replay); the old-log-prob,
    #         reference and update forwards replay them (the trainer takes the experts the samples took)
    # MoE models only (model.path's config.json names num_experts / num_local_experts), megatron backend
    mode: RouterReplayMode = "disabled"


@dataclass
class MoeRouterConfig:
    """The router's auxiliary losses while training (`actor.moe`, `critic.moe`); they add to the loss the
    role minimises and change only the routers' (and through the routing, nothing else's) gradients. None
    = the checkpoint's: config.json's router_aux_loss_coef where its output_router_logits is true (as
    transformers trains), else no aux loss. verl: <role>.megatron.override_transformer_config's
    moe_aux_loss_coeff / moe_z_loss_coeff / moe_router_load_balancing_type (verl's own default is
    "none": no load balancing in RL)."""

    aux_loss_coeff: float | None = None  # megatron's moe_aux_loss_coeff; ≥ 0
    z_loss_coeff: float | None = None  # megatron's moe_z_loss_coeff (router logits' squared logsumexp); ≥ 0
    # megatron's moe_router_load_balancing_type: "aux_loss" (GShard, per micro-batch), "seq_aux_loss"
    # (per sequence, DeepSeek-V2/V3), "global_aux_loss" (over the data-parallel batch), "none"; None =
    # "aux_loss" when the aux coefficient is > 0, else "none"
    load_balancing_type: MoeLoadBalancing | None = None
