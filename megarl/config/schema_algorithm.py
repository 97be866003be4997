"""The `algorithm` and `preference` sections of megarl's config (megarl.config.schema holds the tree):
the RL loss and advantage settings, DAPO's dynamic sampling, rollout correction, PF-PPO, and the offline
preference losses. The field comments are the reference documentation."""

from __future__ import annotations

from dataclasses import dataclass, field

from megarl.config.options import (
    AdvEstimator,
    AlgorithmName,
    IsLevel,
    KlController,
    KlEstimator,
    LossAggMode,
    OldLogProb,
    PfPpoReweight,
    PolicyLoss,
    RsLevel,
)


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's algorithm.filter_groups): drop the groups (samples of one prompt)
    whose scores are all equal — under GRPO their advantage is 0 — and generate more prompts until the
    batch holds data.train_batch_size groups again."""

    enable: bool = False
    max_num_gen_batches: int = 10  # generation batches per step at most; then the step fails; ≥ 1


@dataclass
class RolloutCorrectionConfig:
    """Train/rollout mismatch correction (verl's algorithm.rollout_correction, same key names): the engine
    samples with its own kernels and precision, so its log-probs of the sampled tokens (rollout_log_probs)
    differ from the trainer's recomputed old log-probs; ρ = old − rollout per token. Off by default.
    Metrics: rollout_corr/* (weights, masked fractions, the mismatch KL and perplexity ratio)."""

    # truncated importance sampling: weight each token's loss by min(exp(ρ), threshold) per token
    # ("token") or min(exp(Σρ), threshold) per sequence ("sequence"); None = off
    rollout_is: IsLevel | None = None
    rollout_is_threshold: float = 2.0  # the truncation C of the IS weights; > 1
    rollout_is_batch_normalize: bool = False  # divide the weights by their batch mean (mean weight 1)
    # rejection (masked IS): drop tokens ("token"), or whole sequences by exp(Σρ) ("sequence") or
    # exp(mean ρ) ("geometric"), whose ratio lies outside [rollout_rs_threshold_lower,
    # rollout_rs_threshold] from the loss and the advantages; None = off
    rollout_rs: RsLevel | None = None
    rollout_rs_threshold: float | None = None  # upper bound of the kept ratio; needed with rollout_rs; > 1
    rollout_rs_threshold_lower: float | None = None  # lower bound; None = 1 / rollout_rs_threshold
    # drop a whole sequence if any of its tokens has exp(ρ) below this (e.g. 1e-4); None = off
    rollout_token_veto_threshold: float | None = None
    # bypass mode: the engine's log-probs ARE the old log-probs (the old_log_prob forward pass is skipped,
    # so train_rollout_logprob_abs_diff and actor/entropy are not logged); the PPO ratio is then
    # π_θ / π_rollout, which clipping bounds (not 1 even at a step's first optimizer step: the trainer's
    # and the engine's precision differ). Excludes rollout_is / rollout_rs (ρ = old − rollout would be 0;
    # verl's bypass mode computes them from π_θ / π_rollout in the loss, which megarl does not offer)
    bypass_mode: bool = False


@dataclass
class PfPpoConfig:
    """PF-PPO (Zhang et al. 2024; verl's algorithm.use_pf_ppo + algorithm.pf_ppo): each step's batch is
    resampled with replacement, weighted by reward, before the updates (the advantages stay those of the
    drawn samples)."""

    enable: bool = False  # verl: algorithm.use_pf_ppo
    # weights: "pow" = |score|^weight_pow | "max_min" = 1 for the batch's highest and lowest score, else 0 |
    # "max_random" = 0.4 for the highest, 0.1 for the rest
    reweight_method: PfPpoReweight = "pow"
    weight_pow: float = 2.0  # "pow": the exponent; ≥ 0


@dataclass
class AlgorithmConfig:
    # "ppo" (on-policy RL) | "grpo" (PPO with the GRPO estimator) | "sft" | offline preference training:
    # "dpo" | "ipo" | "kto" | "orpo" | "simpo" (see `preference.*`; the `megarl <name>` commands set it) |
    # "rm" (reward-model training on the same pairs: `megarl rm`)
    name: AlgorithmName = "ppo"
    # how advantages are estimated (megarl.algorithms.advantages): "gae" (needs the critic) | "grpo" |
    # "drgrpo" (GRPO without the std division) | "rloo" | "reinforce_plus_plus" |
    # "reinforce_plus_plus_baseline" | "remax" (baseline = the greedy response's score) |
    # "grpo_passk" (pass@k: only a group's unique best response learns, from best − second best) |
    # "opo" (baseline = the length-weighted mean score of the group) | "gpg" (group mean baseline, scaled
    # by batch / samples in groups that give a gradient) | "optimal_token_baseline" (a per-token baseline
    # weighted by the path's gradient norm; needs the actor's Σπ² per token).
    # All but gae, reinforce_plus_plus and remax compare the samples of a prompt: rollout.n ≥ 2.
    # None = auto: "grpo" for name=grpo (which also allows "drgrpo"), else "gae"
    adv_estimator: AdvEstimator | None = None
    # GRPO and grpo_passk divide by the group's std (verl's norm_adv_by_std_in_grpo); false = Dr.GRPO's
    # advantage (algorithm.adv_estimator=drgrpo is the same as grpo with this false)
    norm_adv_by_std_in_grpo: bool = True
    gamma: float = 1.0  # discount factor, in [0, 1]
    lam: float = 1.0  # GAE lambda, in [0, 1]
    use_kl_in_reward: bool = False  # subtract kl_coef·KL from the token rewards (PPO style)
    # KL(policy ‖ reference) per token: "kl"/"k1" = logp − ref | "abs" = |logp − ref| | "mse"/"k2" =
    # ½(logp − ref)² | "low_var_kl"/"k3" = k3 clamped to [−10, 10] (verl's k3; Schulman's k3 unclamped is
    # not offered) | a "+" suffix (e.g. "k3+") = that value with k2's gradient (straight-through, unbiased)
    kl_penalty: KlEstimator = "kl"  # the in-reward KL estimator (verl's algorithm.kl_penalty)
    kl_coef: float = 0.001  # in-reward KL weight (verl: algorithm.kl_ctrl.kl_coef; start value if adaptive)
    # how the in-reward KL coefficient evolves: "fixed" | "adaptive" (Ziegler et al.: steered towards
    # kl_target; the KL it steers on is the batch mean of per-sequence token means, as in verl);
    # adaptive needs use_kl_in_reward=true
    kl_ctrl: KlController = "fixed"
    kl_target: float = 0.1  # adaptive kl_ctrl: the KL to steer towards; > 0
    kl_horizon: int = 10000  # adaptive kl_ctrl: samples over which the coefficient adapts; ≥ 1
    use_kl_loss: bool = False  # add kl_loss_coef·KL to the policy loss (GRPO style)
    kl_loss_type: KlEstimator = "low_var_kl"  # the KL-loss estimator (verl's actor.kl_loss_type)
    kl_loss_coef: float = 0.001  # KL-loss weight (verl's actor.kl_loss_coef); ≥ 0
    # the policy-gradient loss (verl's actor.policy_loss.loss_mode): "vanilla" (PPO clip, token ratio) |
    # "gspo" (sequence ratio, GSPO) | "cispo" (clipped stop-gradient IS weight · A · logp, MiniMax-M1) |
    # "sapo" (soft sigmoid gate instead of the clip) | "gpg" / "reinforce" (−A·logp; "reinforce" is the
    # plain REINFORCE of rollout correction, weighted by the IS weights) | "geo_mean" (GMPO, geometric
    # mean of token ratios) | "clip_cov" / "kl_cov" (Cui et al. 2025: clip or KL-penalise the tokens of
    # highest logp·A covariance). Every loss is weighted by rollout_correction's IS weights when on.
    policy_loss: PolicyLoss = "vanilla"
    # the chosen loss's own parameters (verl's key names), e.g. {clip_cov_ratio: 0.0002, clip_cov_lb: 1.0,
    # clip_cov_ub: 5.0} for clip_cov, {kl_cov_ratio: 0.0002, ppo_kl_coef: 0.1} for kl_cov, {tau_pos: 1.0,
    # tau_neg: 1.05} for sapo; unset keys keep those verl defaults
    policy_loss_params: dict[str, float] = field(default_factory=dict)
    clip_ratio_low: float = 0.2  # PPO ratio clipped below at 1 - clip_ratio_low; in (0, 1)
    clip_ratio_high: float = 0.2  # PPO ratio clipped above at 1 + clip_ratio_high (> clip_ratio_low: DAPO)
    # dual clip (Ye et al. 2020): cap the loss of A < 0 tokens at −A·clip_ratio_c; > 1, null = off. On at
    # 3.0 by default as in verl; only policy_loss=vanilla applies it (verl's GSPO and the others don't)
    clip_ratio_c: float | None = 3.0
    value_clip: float = 0.5  # critic values clipped to old value ± value_clip
    entropy_coeff: float = 0.0  # weight of the entropy bonus
    # how token losses become one scalar: "token-mean" | "seq-mean-token-sum" | "seq-mean-token-mean" |
    # "seq-mean-token-sum-norm" (Dr.GRPO: Σ tokens / (num_seqs · data.max_response_length), the paper's and
    # TRL's normalisation; verl divides by max_response_length only, so its loss, and what gradient
    # clipping sees, is num_seqs times ours). None = auto: "seq-mean-token-mean" for policy_loss=gspo and
    # sapo (verl forces that mode for both; megarl honours an explicit setting), else "token-mean"
    loss_agg_mode: LossAggMode | None = None
    ppo_epochs: int = 1  # passes over each step's rollouts
    ppo_mini_batch_size: int = 16  # prompts per optimizer step (× rollout.n sequences); divides train batch
    # where the PPO ratio's old log-probs come from: "recompute" (a forward pass of the actor after
    # generation, as verl does) | "fused" (the update's own forward, detached: the ratio is exactly 1,
    # which is what a recompute gives when a step makes ONE optimizer step over its rollouts; TRL does
    # this at num_iterations=1). Fused saves a forward pass per step and still logs actor/entropy and
    # train_rollout_logprob_abs_diff(_max), from the update's forward. It needs one optimizer step per
    # training step (ppo_epochs=1, ppo_mini_batch_size=data.train_batch_size) and no stage reading the
    # old log-probs before the update (use_kl_in_reward, rollout_correction, pf_ppo,
    # optimal_token_baseline). None = auto: "fused" where allowed, else "recompute".
    old_log_prob: OldLogProb | None = None
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)  # DAPO dynamic sampling
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    pf_ppo: PfPpoConfig = field(default_factory=PfPpoConfig)  # PF-PPO reward-weighted resampling


@dataclass
class PreferenceConfig:
    """Offline preference training (`megarl dpo|ipo|kto|orpo|simpo`, megarl.algorithms.preference). One
    optimizer step per data.train_batch_size pairs (KTO: examples); the loss is the mean over them."""

    # the β of DPO/IPO/KTO/SimPO (IPO's τ) and ORPO's λ (the odds-ratio weight); None = the loss's default: 2.0 for
    # simpo (the SimPO paper's range is 2–2.5), else 0.1 (TRL's defaults)
    beta: float | None = None
    # dpo, simpo: conservative-DPO label smoothing ε (the chance a label is flipped), in [0, 0.5)
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5  # simpo: target reward margin γ, in reward units (TRL's simpo_gamma)
    desirable_weight: float = 1.0  # kto: λ_D, the weight of desirable examples' losses
    undesirable_weight: float = 1.0  # kto: λ_U, the weight of undesirable examples' losses
    # dpo, ipo, kto: compute the reference log-probs of the whole data set in one pass before training
    # and keep them (then the reference model is offloaded), instead of a reference forward per batch
    precompute_ref: bool = False
