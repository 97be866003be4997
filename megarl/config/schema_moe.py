"""MoE settings of the actor (`actor.router_replay`): rollout routing replay, verl's names and modes. The
rules: megarl.config.moe_checks; the mechanism: megarl.models.moe_replay.

With identical weights an MoE router in the trainer and one in the rollout engine still send some tokens
to other experts (different kernels, different sums), so the trainer's log-probs are not the ones the
samples were drawn from. Replaying routes makes the trainer's forwards take the experts given; the
gating weights are recomputed from the trainer's own router logits at those experts, so the router
still trains. A token without a route (-1) is routed live.
"""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config.options import RouterReplayMode


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
