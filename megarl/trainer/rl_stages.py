"""The stages of one RL step (DESIGN §3) and the graph each algorithm is built from.

    remax_baseline?  generate  reward_model?  reward  token_rewards  filter_groups?  balance_batch?
    old_log_prob  rollout_correction?  ref_log_prob?  values?  advantages  pf_ppo?  update_critic?  update_actor

`build_rl_dataflow(cfg, roles, reward)` assembles the graph for `algorithm.adv_estimator`: GAE adds the
critic's stages, ReMax the greedy-baseline generation, a KL term the reference, a reward model its
scoring, DAPO's dynamic sampling its filter, rollout correction its weights/rejection (in bypass mode
old_log_prob copies the engine's log-probs instead of recomputing them), PF-PPO its resampling. The trainer and the Python API run the same graph; users edit it with Dataflow's methods.

The scoring stages (remax_baseline, reward_model, reward, token_rewards, filter_groups) are in
`megarl.trainer.scoring`: a stage inserted between reward and token_rewards changes what trains; one
rewriting `scores` after token_rewards is refused when it is inserted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from megarl.agentic.metrics import AGENT_TENSOR_COLUMNS, agent_metrics
from megarl.algorithms import (
    KLController,
    apply_kl_penalty,
    build_kl_controller,
    compute_advantages,
    kl_penalty,
)
from megarl.algorithms.aggregate import masked_mean
from megarl.algorithms.estimator_traits import ESTIMATOR_TRAITS
from megarl.algorithms.pf_ppo import pf_ppo_resample
from megarl.algorithms.rollout_correction import compute_rollout_correction
from megarl.config.schema import MegarlConfig
from megarl.data.batching import dp_balance_order, imbalance
from megarl.models.moe_replay import disagreement
from megarl.protocol import Batch, Col
from megarl.rollout.base import ROLLOUT_COLUMNS
from megarl.trainer.dataflow import Dataflow, Stage, StepContext
from megarl.trainer.roles import RoleGroups
from megarl.trainer.scoring import (
    DATASET_COLUMNS,
    PROMPT_COLUMNS,
    SEQUENCE_COLUMNS,
    filter_groups_stage,
    remax_baseline_stage,
    reward_model_stage,
    reward_stage,
    scoring_stages,
    token_rewards_stage,
)
from megarl.workers.groups import ActorGroup, CriticGroup, RefGroup
from megarl.workers.routes import LIVE_ROUTES

if TYPE_CHECKING:
    from megarl.rewards import RewardComputer
    from megarl.trainer.rollout_pool import RolloutPool


# worker metric names -> the names users read in metrics.jsonl (verl's where verl has one)
_RENAMES = {
    "actor/pg_clipfrac": "actor/clip_frac",
    "critic/vf_loss": "critic/value_loss",
    # algorithm.old_log_prob=fused: the update logs what the old_log_prob stage otherwise does
    "actor/train_rollout_logprob_abs_diff": "train_rollout_logprob_abs_diff",
    "actor/train_rollout_logprob_abs_diff_max": "train_rollout_logprob_abs_diff_max",
}


def role_metrics(role: str, metrics: dict[str, float] | list[dict[str, float]]) -> dict[str, float]:
    """A worker's update metrics under `<role>/` names (grad_norm -> actor/grad_norm, ...). A DP_COMPUTE
    update returns one dict per data-parallel replica, all equal (the workers all-reduce them)."""
    if isinstance(metrics, list):
        metrics = metrics[0]
    out = {}
    for key, value in metrics.items():
        name = key if "/" in key else f"{role}/{key}"
        out[_RENAMES.get(name, name)] = float(value)
    return out


def generate_stage(
    actor: ActorGroup, log_probs: bool = False, multi_turn: bool = False, routes: bool = False
) -> Stage:
    """The rollouts, with the engine's log-probs when `log_probs` (rollout.calculate_log_probs), the
    turns' scores (`turn_rewards`) when `multi_turn` (rollout.multi_turn.enable) and each token's routed
    experts when `routes` (an MoE actor with router_replay R3)."""

    def generate(ctx: StepContext, prompts: Batch) -> Batch:
        out = actor.generate(prompts, validate=ctx.validate)
        report = out.meta.pop("hybrid_engine", None)  # the first replica's sync report; too big to carry
        if report is not None and not ctx.validate:
            seconds = report["seconds"]  # offload → sync (reshard into the engine) → generate → reload
            ctx.metrics["generate/transition_seconds"] = (
                seconds["offload"] + seconds["sync"] + seconds["reload"]
            )
            ctx.metrics["generate/engine_seconds"] = seconds["generate"]
            # what the weight sync moved into this replica's engine, over the plan's floor (1.00 = the floor)
            ctx.metrics["generate/sync_received_bytes"] = report["reshard"]["received_bytes"]
            ctx.metrics["generate/sync_bytes_over_floor"] = report["reshard"]["ratio"]
            if report["reshard"].get("lora_sync"):  # LoRA: the adapter bytes the engine took
                ctx.metrics["generate/sync_adapter_bytes"] = report["reshard"]["adapter_bytes"]
        if not ctx.validate:
            ctx.metrics.update(agent_metrics(out))
        return out

    writes = ROLLOUT_COLUMNS + ((Col.ROLLOUT_LOG_PROBS,) if log_probs else ())
    writes += (Col.TURN_REWARDS, *AGENT_TENSOR_COLUMNS) if multi_turn else ()
    writes += (Col.ROUTED_EXPERTS,) if routes else ()
    # each prompt's columns carried to its samples (the mask extended over the response): what was
    # derived from the prompts (ReMax's baseline) holds for the samples
    refines = (Col.PROMPTS, Col.ATTENTION_MASK, Col.UID)
    return Stage("generate", generate, reads=PROMPT_COLUMNS, writes=writes, new_rows=True, refines=refines)


def pool_generate_stage(pool: RolloutPool, log_probs: bool = False, multi_turn: bool = False) -> Stage:
    """rollout.placement=separate: the step's rollouts from the engines' own pool — generated ahead while
    the actor trained, within async_training.max_staleness versions (megarl.trainer.rollout_pool)."""

    def generate(ctx: StepContext, prompts: Batch) -> Batch:
        if ctx.validate:  # after step s the weights are version s
            return pool.generate_now(prompts, validate=True, version=ctx.step)
        batch, metrics = pool.batch_for_step(ctx.step, prompts)
        ctx.metrics.update(metrics)
        return batch

    writes = ROLLOUT_COLUMNS + ((Col.ROLLOUT_LOG_PROBS,) if log_probs else ()) + (Col.ROLLOUT_VERSION,)
    writes += (Col.TURN_REWARDS, *AGENT_TENSOR_COLUMNS) if multi_turn else ()
    if pool.partial:  # each token's version (a response may span syncs)
        writes += (Col.ROLLOUT_TOKEN_VERSIONS,)
    refines = (Col.PROMPTS, Col.ATTENTION_MASK, Col.UID)
    return Stage("generate", generate, reads=PROMPT_COLUMNS, writes=writes, new_rows=True, refines=refines)


def balance_stage(dp_size: int) -> Stage:
    """trainer.balance_batch: the batch reordered so that its contiguous split over the actor's `dp_size`
    data-parallel ranks gives each about the same number of real tokens (advantages group by uid, not
    by position). Logs the largest rank's tokens over the mean, before and after."""

    def balance(ctx: StepContext, batch: Batch) -> Batch:
        lengths = batch[Col.ATTENTION_MASK].sum(-1).tolist()
        share = len(lengths) // dp_size
        order = dp_balance_order(lengths, dp_size)
        ranks = [range(r * share, (r + 1) * share) for r in range(dp_size)]
        ctx.metrics["balance/dp_token_imbalance_before"] = imbalance(lengths, ranks)
        ctx.metrics["balance/dp_token_imbalance"] = imbalance(
            lengths, [order[r.start : r.stop] for r in ranks]
        )
        return batch.reorder(order)

    return Stage("balance_batch", balance, reads=(Col.ATTENTION_MASK,), new_rows=True)


def old_log_prob_stage(
    actor: ActorGroup,
    with_sum_pi_squared: bool = False,
    with_rollout: bool = False,
    router_replay: str = "disabled",
) -> Stage:
    """The policy's own log-probs before the update (plus Σπ² per token for the optimal token baseline)
    and, `with_rollout` (the batch has the engine's log-probs), how far the engine's are from them.
    MoE `router_replay`: R3 replays the engine's routes and logs how often the trainer's routers would
    have chosen otherwise; R2 records the routes the update replays."""

    def log_prob(ctx: StepContext, batch: Batch) -> Batch:
        out = actor.log_prob(batch.select(SEQUENCE_COLUMNS + replay_reads))
        if router_replay == "R3":
            live = out.tensors.pop(LIVE_ROUTES)
            mask = batch[Col.ATTENTION_MASK].bool()
            shares = disagreement(live[mask], batch[Col.ROUTED_EXPERTS][mask])
            ctx.metrics["router_replay/disagreement_token_share"] = shares["token_share"]
            ctx.metrics["router_replay/disagreement_layer_token_share"] = shares["layer_token_share"]
        if router_replay != "disabled":
            routes = batch[Col.ROUTED_EXPERTS] if router_replay == "R3" else out[Col.ROUTED_EXPERTS]
            ctx.metrics["router_replay/route_bytes"] = routes.numel() * routes.element_size()
        if with_rollout:
            mask = batch[Col.RESPONSE_MASK] > 0
            behaviour_minus_policy = (batch[Col.ROLLOUT_LOG_PROBS] - out[Col.OLD_LOG_PROBS])[mask]
            diff = behaviour_minus_policy.abs()
            ctx.metrics["train_rollout_logprob_abs_diff"] = diff.mean().item() if diff.numel() else 0.0
            ctx.metrics["train_rollout_logprob_abs_diff_max"] = diff.max().item() if diff.numel() else 0.0
            # KL(behaviour ‖ policy) estimated on the behaviour's own samples (k1): the engine's precision
            # alone when on-policy, plus the versions' drift when the samples are stale (async_training)
            ctx.metrics["mismatch_kl"] = behaviour_minus_policy.mean().item() if diff.numel() else 0.0
        ctx.metrics["actor/entropy"] = masked_mean(out[Col.ENTROPY], batch[Col.RESPONSE_MASK]).item()
        return out

    replay_reads = (Col.ROUTED_EXPERTS,) if router_replay == "R3" else ()
    writes = (Col.OLD_LOG_PROBS, Col.ENTROPY) + ((Col.SUM_PI_SQUARED,) if with_sum_pi_squared else ())
    return Stage(
        "old_log_prob",
        log_prob,
        reads=SEQUENCE_COLUMNS + ((Col.ROLLOUT_LOG_PROBS,) if with_rollout else ()) + replay_reads,
        writes=writes + ((Col.ROUTED_EXPERTS,) if router_replay == "R2" else ()),
    )


def bypass_old_log_prob_stage() -> Stage:
    """Rollout-correction bypass mode: the engine's log-probs serve as the old log-probs (no forward pass)."""

    def bypass(ctx: StepContext, batch: Batch) -> dict:
        return {Col.OLD_LOG_PROBS: batch[Col.ROLLOUT_LOG_PROBS].float()}

    return Stage("old_log_prob", bypass, reads=(Col.ROLLOUT_LOG_PROBS,), writes=(Col.OLD_LOG_PROBS,))


def rollout_correction_stage(cfg: MegarlConfig) -> Stage:
    """Train/rollout mismatch correction (algorithm.rollout_correction): truncated IS weights for the
    loss and/or rejection of tokens and sequences from the response mask (so from advantages and loss)."""
    rc = cfg.algorithm.rollout_correction
    rejects = rc.rollout_rs is not None or rc.rollout_token_veto_threshold is not None

    def correct(ctx: StepContext, batch: Batch) -> dict:
        mask = batch[Col.RESPONSE_MASK]
        weights, kept, metrics = compute_rollout_correction(
            batch[Col.OLD_LOG_PROBS].float(),
            batch[Col.ROLLOUT_LOG_PROBS].float(),
            mask.float(),
            is_level=rc.rollout_is,
            is_threshold=rc.rollout_is_threshold,
            is_batch_normalize=rc.rollout_is_batch_normalize,
            rs_level=rc.rollout_rs,
            rs_threshold=rc.rollout_rs_threshold,
            rs_threshold_lower=rc.rollout_rs_threshold_lower,
            veto_threshold=rc.rollout_token_veto_threshold,
        )
        ctx.metrics.update({k: float(v) for k, v in metrics.items()})
        out = {Col.ROLLOUT_IS_WEIGHTS: weights} if weights is not None else {}
        if rejects:
            out[Col.RESPONSE_MASK] = kept.to(mask.dtype)
        return out

    writes = ((Col.ROLLOUT_IS_WEIGHTS,) if rc.rollout_is else ()) + ((Col.RESPONSE_MASK,) if rejects else ())
    return Stage(
        "rollout_correction",
        correct,
        reads=(Col.OLD_LOG_PROBS, Col.ROLLOUT_LOG_PROBS, Col.RESPONSE_MASK),
        writes=writes,
        # rejection trims the mask for the update and the estimator; the reward keeps its place on the
        # original last token (verl's behaviour, see advantages_stage)
        refines=(Col.RESPONSE_MASK,) if rejects else (),
    )


def ref_log_prob_stage(ref: RefGroup, replay: bool = False) -> Stage:
    """The reference's log-probs; `replay` (MoE router replay): through the batch's routed experts."""
    reads = SEQUENCE_COLUMNS + ((Col.ROUTED_EXPERTS,) if replay else ())

    def log_prob(ctx: StepContext, batch: Batch) -> Batch:
        return ref.ref_log_prob(batch.select(reads))

    return Stage("ref_log_prob", log_prob, reads=reads, writes=(Col.REF_LOG_PROBS,))


def values_stage(critic: CriticGroup) -> Stage:
    def values(ctx: StepContext, batch: Batch) -> Batch:
        return critic.values(batch.select(SEQUENCE_COLUMNS))

    return Stage("values", values, reads=SEQUENCE_COLUMNS, writes=(Col.VALUES,))


def advantages_stage(cfg: MegarlConfig) -> tuple[Stage, KLController]:
    """Token rewards (scores, minus kl_coef·KL when algorithm.use_kl_in_reward) -> advantages, returns."""
    algo = cfg.algorithm
    assert algo.adv_estimator is not None  # the config is resolved
    kl_ctrl = build_kl_controller(algo.kl_ctrl, algo.kl_coef, algo.kl_target, algo.kl_horizon)
    inputs = {
        "gae": (Col.VALUES,),
        "remax": (Col.BASELINE_SCORES,),
        "optimal_token_baseline": (Col.OLD_LOG_PROBS, Col.SUM_PI_SQUARED),
    }.get(algo.adv_estimator, ())
    kl_inputs = (Col.OLD_LOG_PROBS, Col.REF_LOG_PROBS) if algo.use_kl_in_reward else ()
    traits = ESTIMATOR_TRAITS[algo.adv_estimator]
    options = {"norm_by_std": algo.norm_adv_by_std_in_grpo} if traits.std_norm_flag else {}

    def column(batch: Batch, name: str) -> torch.Tensor | None:
        return batch[name].float() if name in batch else None

    def advantages(ctx: StepContext, batch: Batch) -> dict:
        mask = batch[Col.RESPONSE_MASK].float()
        token_rewards = batch[Col.TOKEN_LEVEL_SCORES].float()
        if algo.use_kl_in_reward:
            kl = kl_penalty(batch[Col.OLD_LOG_PROBS], batch[Col.REF_LOG_PROBS], algo.kl_penalty)
            token_rewards, kl_mean = apply_kl_penalty(token_rewards, kl, mask, kl_ctrl.value)
            ctx.metrics["kl/mean"], ctx.metrics["kl/coef"] = float(kl_mean), kl_ctrl.value
            kl_ctrl.update(kl_mean, len(batch))
        adv, returns = compute_advantages(
            algo.adv_estimator,
            token_rewards=token_rewards,
            # a sequence's reward, even where rollout correction masked its last token out (verl's sum)
            scores=token_rewards.sum(-1),
            values=column(batch, Col.VALUES),
            baseline_scores=column(batch, Col.BASELINE_SCORES),
            old_log_probs=column(batch, Col.OLD_LOG_PROBS),
            sum_pi_squared=column(batch, Col.SUM_PI_SQUARED),
            rollout_is_weights=column(batch, Col.ROLLOUT_IS_WEIGHTS),
            group_ids=torch.as_tensor(batch[Col.UID]).long(),
            mask=mask,
            gamma=algo.gamma,
            lam=algo.lam,
            **options,
        )
        ctx.metrics["advantages/mean"] = masked_mean(adv, mask).item()
        return {Col.TOKEN_LEVEL_REWARDS: token_rewards, Col.ADVANTAGES: adv, Col.RETURNS: returns}

    stage = Stage(
        "advantages",
        advantages,
        reads=(Col.TOKEN_LEVEL_SCORES, Col.RESPONSE_MASK, Col.UID, *inputs, *kl_inputs),
        writes=(Col.TOKEN_LEVEL_REWARDS, Col.ADVANTAGES, Col.RETURNS),
    )
    return stage, kl_ctrl


def pf_ppo_stage(cfg: MegarlConfig) -> Stage:
    """PF-PPO: the step's batch resampled with replacement, weighted by each sequence's score."""
    pf = cfg.algorithm.pf_ppo

    def resample(ctx: StepContext, batch: Batch) -> Batch:
        generator = torch.Generator().manual_seed(cfg.trainer.seed * 1_000_003 + ctx.step)
        rows = pf_ppo_resample(batch[Col.SCORES].float(), generator, pf.reweight_method, pf.weight_pow)
        ctx.metrics["pf_ppo/unique_frac"] = len(set(rows.tolist())) / max(len(batch), 1)
        return batch[rows]

    return Stage("pf_ppo", resample, reads=(Col.SCORES, Col.ADVANTAGES), new_rows=True)


def update_critic_stage(critic: CriticGroup) -> Stage:
    def update(ctx: StepContext, batch: Batch) -> None:
        metrics = critic.update(batch.select([*SEQUENCE_COLUMNS, Col.VALUES, Col.RETURNS]))
        ctx.metrics.update(role_metrics("critic", metrics))

    return Stage("update_critic", update, reads=(Col.VALUES, Col.RETURNS))


def update_actor_stage(
    actor: ActorGroup,
    use_kl_loss: bool,
    with_is_weights: bool = False,
    fused_old_log_prob: bool = False,
    with_rollout: bool = False,
    replay: bool = False,
) -> Stage:
    """The policy update. With `fused_old_log_prob` (algorithm.old_log_prob=fused) the update's forward
    gives the old log-probs and the metrics the old_log_prob stage would have logged: it reads the
    engine's log-probs (when the batch has them, `with_rollout`) instead of old ones."""
    old = (Col.ROLLOUT_LOG_PROBS,) if with_rollout else ()
    old = old if fused_old_log_prob else (Col.OLD_LOG_PROBS,)
    columns = (*old, Col.ADVANTAGES) + ((Col.REF_LOG_PROBS,) if use_kl_loss else ())
    columns += (Col.ROLLOUT_IS_WEIGHTS,) if with_is_weights else ()
    columns += (Col.ROUTED_EXPERTS,) if replay else ()  # MoE router replay

    def update(ctx: StepContext, batch: Batch) -> None:
        metrics = actor.update(batch.select([*SEQUENCE_COLUMNS, *columns]))
        ctx.metrics.update(role_metrics("actor", metrics))
        if replay and fused_old_log_prob:  # (the old_log_prob stage logs it otherwise)
            routes = batch[Col.ROUTED_EXPERTS]
            ctx.metrics["router_replay/route_bytes"] = routes.numel() * routes.element_size()

    return Stage("update_actor", update, reads=columns)


def build_rl_dataflow(
    cfg: MegarlConfig,
    roles: RoleGroups,
    reward: RewardComputer,
    more_prompts: Callable[[], Batch] | None = None,
    flow_class: type[Dataflow] = Dataflow,
    pool: RolloutPool | None = None,
) -> tuple[Dataflow, KLController]:
    """The step graph for `cfg` (resolved): returns (graph, KL controller of the in-reward KL).
    `more_prompts()` gives the next prompt batch (DAPO's dynamic sampling asks for it); `flow_class`:
    the graph's class (the Python API's adds its entry points); `pool`: the engines' own pool
    (rollout.placement=separate), which then generates instead of the actor's colocated engine."""
    algo = cfg.algorithm
    flow = flow_class(inputs=(*PROMPT_COLUMNS, Col.UID, *DATASET_COLUMNS))

    def before(name: str) -> Callable[[], list[Stage]]:
        """The flow's stages before `name` (prompts in, scored rollouts out), as they are when it runs."""
        return lambda: flow.stages[: flow.names.index(name)]

    stages = []
    if algo.adv_estimator == "remax":
        stages.append(remax_baseline_stage(roles.actor, lambda: scoring_stages(flow)))
    with_rollout = bool(cfg.rollout.calculate_log_probs)  # the batch has the engine's log-probs
    multi_turn = cfg.rollout.multi_turn.enable  # the rollout writes each turn's score (turn_rewards)
    replay = cfg.actor.router_replay.mode  # MoE: R3's routes come from the engine, R2's from old_log_prob
    if pool is not None:
        generate = pool_generate_stage(pool, with_rollout, multi_turn)
    else:
        generate = generate_stage(roles.actor, with_rollout, multi_turn, replay == "R3")
    stages.append(generate)
    if roles.reward_model is not None:
        stages.append(reward_model_stage(roles.reward_model))
    stages.append(reward_stage(reward, roles.reward_model is not None))
    # the turns' scores train when the generate stage writes them
    stages.append(token_rewards_stage(turn_rewards=Col.TURN_REWARDS in generate.writes))
    if algo.filter_groups.enable:
        if more_prompts is None:
            raise ValueError("algorithm.filter_groups needs a prompt source (more_prompts) to generate more")
        stages.append(filter_groups_stage(cfg, more_prompts, before("filter_groups")))
    dp = cfg.layout("actor").dp
    if cfg.trainer.balance_batch and dp > 1:
        stages.append(balance_stage(dp))
    rc = algo.rollout_correction
    fused = algo.old_log_prob == "fused"  # the update computes them (resolved: auto decided)
    if rc.bypass_mode:
        stages.append(bypass_old_log_prob_stage())
    elif not fused:
        assert algo.adv_estimator is not None  # the config is resolved
        needs_pi2 = ESTIMATOR_TRAITS[algo.adv_estimator].needs_sum_pi_squared
        stages.append(old_log_prob_stage(roles.actor, needs_pi2, with_rollout, replay))
    if rc.rollout_is or rc.rollout_rs or rc.rollout_token_veto_threshold is not None:
        stages.append(rollout_correction_stage(cfg))
    if roles.ref is not None:
        stages.append(ref_log_prob_stage(roles.ref, replay != "disabled"))
    if roles.critic is not None:
        stages.append(values_stage(roles.critic))
    advantages, kl_ctrl = advantages_stage(cfg)
    stages.append(advantages)
    if algo.pf_ppo.enable:
        stages.append(pf_ppo_stage(cfg))
    if roles.critic is not None:
        stages.append(update_critic_stage(roles.critic))
    stages.append(
        update_actor_stage(
            roles.actor,
            algo.use_kl_loss,
            rc.rollout_is is not None,
            fused,
            with_rollout,
            replay != "disabled",
        )
    )
    for stage in stages:
        flow.add_stage(stage)
    flow.check(awaiting=reward.column_terms)  # the user's stages write them, once the graph is built
    return flow, kl_ctrl
