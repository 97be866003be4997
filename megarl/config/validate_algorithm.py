"""Cross-field checks of `algorithm.*` (estimator, losses, KL, rollout correction, PF-PPO): part of
`megarl.config.validate.validate`, each problem a line naming the key, what is wrong and the fix."""

from __future__ import annotations

from typing import Any

from megarl.algorithms.estimator_traits import CRITIC_ESTIMATORS, ESTIMATOR_TRAITS, GROUP_ESTIMATORS
from megarl.algorithms.loss_traits import LOSS_PARAMS
from megarl.config.errors import at_least, in_range
from megarl.config.schema import MegarlConfig

_GRPO_ESTIMATORS = ("grpo", "drgrpo")  # what algorithm.name=grpo allows
RL_ALGORITHMS = ("ppo", "grpo")
PREFERENCE_ALGORITHMS = ("dpo", "ipo", "kto", "orpo", "simpo")
REFERENCE_ALGORITHMS = ("dpo", "ipo", "kto")  # the preference losses that compare with a reference


def fused_old_log_prob_blockers(cfg: MegarlConfig) -> list[str]:
    """Why algorithm.old_log_prob=fused would be wrong for `cfg` (resolved): [] when it is allowed."""
    a, rc = cfg.algorithm, cfg.algorithm.rollout_correction
    why = []
    if a.ppo_epochs != 1:
        why.append(f"algorithm.ppo_epochs={a.ppo_epochs} (needs 1)")
    if a.ppo_mini_batch_size != cfg.data.train_batch_size:
        why.append(
            f"algorithm.ppo_mini_batch_size={a.ppo_mini_batch_size} is not data.train_batch_size="
            f"{cfg.data.train_batch_size} (one optimizer step per training step)"
        )
    if a.use_kl_in_reward:
        why.append("algorithm.use_kl_in_reward=true (the reward's KL reads the old log-probs)")
    if rc.bypass_mode or rc.rollout_is is not None or rc.rollout_rs is not None:
        why.append("algorithm.rollout_correction is on (it reads the old log-probs)")
    if rc.rollout_token_veto_threshold is not None:
        why.append("algorithm.rollout_correction.rollout_token_veto_threshold is set")
    if a.pf_ppo.enable:
        why.append("algorithm.pf_ppo.enable=true")
    if cfg.async_training.max_staleness > 0:
        why.append(
            f"async_training.max_staleness={cfg.async_training.max_staleness} (the samples come from older "
            "weights: the proximal policy is recomputed)"
        )
    if cfg.actor.router_replay.mode == "R2":
        why.append(
            "actor.router_replay.mode=R2 (the old-log-prob forward records the routes the update replays)"
        )
    traits = ESTIMATOR_TRAITS.get(a.adv_estimator)
    if traits is not None and traits.needs_sum_pi_squared:
        why.append(f"algorithm.adv_estimator={a.adv_estimator} (reads the old log-probs' Σπ²)")
    return why


def fused_old_log_prob_problem(cfg: MegarlConfig) -> str | None:
    """The one owner of the fused old-log-prob rule: why an RL config (resolved) that says
    algorithm.old_log_prob=fused cannot have it, key by key with the fix; None when it can. Checked at
    load (`validate`) and where the RL trainer resolves its config (`resolve_for_run`); the update reads
    the resolved value."""
    a = cfg.algorithm
    if a.name not in RL_ALGORITHMS or a.old_log_prob != "fused":
        return None
    blockers = fused_old_log_prob_blockers(cfg)
    if not blockers:
        return None
    return (
        f"algorithm.old_log_prob=fused, but {'; '.join(blockers)}: the fused old log-probs come from the "
        "update's own forward, which is right only for one optimizer step per training step with nothing "
        "reading them first; set algorithm.old_log_prob=recompute (or leave it unset, None in Python: auto)"
    )


def rollout_log_prob_readers(cfg: MegarlConfig) -> list[str]:
    """What in `cfg` reads the engine's log-probs of its sampled tokens: [] when nothing does."""
    rc = cfg.algorithm.rollout_correction
    on = {
        "bypass_mode": rc.bypass_mode,
        "rollout_is": rc.rollout_is is not None,
        "rollout_rs": rc.rollout_rs is not None,
        "rollout_token_veto_threshold": rc.rollout_token_veto_threshold is not None,
    }
    readers = [f"algorithm.rollout_correction.{key}" for key, is_on in on.items() if is_on]
    if cfg.async_training.max_staleness > 0:  # the behaviour policy's, beside the recomputed proximal one
        readers.append(f"async_training.max_staleness={cfg.async_training.max_staleness}")
    return readers


def check_algorithm(cfg: MegarlConfig, problems: list[str]) -> None:
    a = cfg.algorithm
    readers = rollout_log_prob_readers(cfg)
    if a.name in RL_ALGORITHMS and cfg.rollout.calculate_log_probs is False and readers:
        problems.append(
            f"rollout.calculate_log_probs=false, but {', '.join(readers)} reads the engine's log-probs; "
            "set rollout.calculate_log_probs=true (or leave it unset: auto)"
        )
    if problem := fused_old_log_prob_problem(cfg):
        problems.append(problem)
    if a.name in PREFERENCE_ALGORITHMS:
        _check_preference(cfg, problems)
    val = cfg.rollout.val
    if a.adv_estimator == "remax" and (val.n != 1 or val.temperature != 0):
        problems.append(
            f"algorithm.adv_estimator=remax takes its baseline from the greedy response (rollout.val sampling), "
            f"but rollout.val.n={val.n}, rollout.val.temperature={val.temperature}; set rollout.val.n=1 and "
            "rollout.val.temperature=0"
        )
    if a.filter_groups.enable:
        at_least(
            problems,
            "algorithm.filter_groups.max_num_gen_batches",
            a.filter_groups.max_num_gen_batches,
            1,
            "e.g. 10",
        )
        if cfg.rollout.n < 2:
            problems.append(
                f"algorithm.filter_groups.enable=true compares the samples of a prompt, but rollout.n={cfg.rollout.n}; "
                "set rollout.n >= 2 (e.g. 8) or algorithm.filter_groups.enable=false"
            )
    if a.name == "grpo" and a.adv_estimator not in _GRPO_ESTIMATORS:
        problems.append(
            f"algorithm.adv_estimator={a.adv_estimator} contradicts algorithm.name=grpo (which uses "
            f"{' or '.join(_GRPO_ESTIMATORS)}); remove adv_estimator or set algorithm.name=ppo"
        )
    if a.name in RL_ALGORITHMS and a.adv_estimator in CRITIC_ESTIMATORS and not cfg.critic.enable:
        problems.append(
            f"algorithm.adv_estimator={a.adv_estimator} needs a value model but critic.enable=false; "
            "set critic.enable=true or use a critic-free estimator: algorithm.adv_estimator=grpo, drgrpo, "
            "rloo, reinforce_plus_plus, reinforce_plus_plus_baseline or remax"
        )
    if a.name in RL_ALGORITHMS and a.adv_estimator in GROUP_ESTIMATORS and cfg.rollout.n < 2:
        problems.append(
            f"rollout.n={cfg.rollout.n} but algorithm.adv_estimator={a.adv_estimator} compares the samples of "
            "each prompt; set rollout.n ≥ 2 (e.g. 8)"
        )
    for flag in ("use_kl_in_reward", "use_kl_loss"):
        if getattr(a, flag) and not cfg.ref.enable:
            problems.append(
                f"algorithm.{flag}=true needs the reference model but ref.enable=false; "
                f"set ref.enable=true or algorithm.{flag}=false"
            )
    r = cfg.reward
    if r.enable and r.backend != "megatron" and (r.parallel.tp, r.parallel.pp, r.parallel.cp) != (1, 1, 1):
        problems.append(
            f"reward.backend={r.backend} runs the classifier data-parallel only, but reward.parallel has tp={r.parallel.tp}, "
            f"pp={r.parallel.pp}, cp={r.parallel.cp}; set them to 1 or use reward.backend=megatron"
        )
    if r.enable and r.backend != "megatron":
        at_least(problems, "reward.max_length", r.max_length, 1, "e.g. 512 tokens")
    if r.enable and r.backend == "megatron" and r.kind != "classifier":
        problems.append(
            f"reward.kind={r.kind} needs reward.backend=hf or fsdp (a sentence-embedding model runs in transformers)"
        )
    if cfg.reward.enable and not cfg.reward.model_path:
        problems.append(
            "reward.enable=true but reward.model_path is not set; set reward.model_path=/path/to/reward_model "
            "or reward.enable=false to use rule rewards"
        )
    for name in ("gamma", "lam"):
        value = getattr(a, name)
        in_range(problems, f"algorithm.{name}", value, "[0, 1]", 0 <= value <= 1, "e.g. 1.0")
    at_least(problems, "algorithm.kl_coef", a.kl_coef, 0, "e.g. 0.001, or 0 for no KL")
    at_least(problems, "algorithm.kl_loss_coef", a.kl_loss_coef, 0, "e.g. 0.001, or 0 for no KL loss")
    own = LOSS_PARAMS[a.policy_loss]
    for key in sorted(set(a.policy_loss_params) - set(own)):
        takes = f"it takes {', '.join(own)}" if own else "it takes no parameters"
        problems.append(
            f"algorithm.policy_loss_params.{key} is not a parameter of algorithm.policy_loss={a.policy_loss} "
            f"({takes}); remove it or pick the loss it belongs to"
        )
    _check_rollout_correction(a.rollout_correction, problems)
    if a.rollout_correction.bypass_mode and ESTIMATOR_TRAITS[a.adv_estimator].needs_sum_pi_squared:
        problems.append(
            f"algorithm.adv_estimator={a.adv_estimator} needs the actor's Σπ² per token, which its log-prob "
            "pass computes, but algorithm.rollout_correction.bypass_mode=true skips that pass; set "
            "bypass_mode=false or pick another estimator"
        )
    if a.pf_ppo.enable:
        at_least(problems, "algorithm.pf_ppo.weight_pow", a.pf_ppo.weight_pow, 0, "e.g. 2.0")
    ok = 0 < a.clip_ratio_low < 1
    in_range(problems, "algorithm.clip_ratio_low", a.clip_ratio_low, "(0, 1)", ok, "e.g. 0.2")
    if a.clip_ratio_high <= 0:
        problems.append(f"algorithm.clip_ratio_high={a.clip_ratio_high} must be > 0; e.g. 0.2 (or 0.28)")
    if a.clip_ratio_c is not None and a.clip_ratio_c <= 1:
        problems.append(
            f"algorithm.clip_ratio_c={a.clip_ratio_c} must be > 1 (dual clip caps the loss of negative-advantage "
            "tokens at clip_ratio_c·|A|); e.g. 3.0, or null to disable dual clip"
        )
    if a.kl_ctrl == "adaptive":
        if not a.use_kl_in_reward:
            problems.append(
                "algorithm.kl_ctrl=adaptive steers the in-reward KL coefficient but algorithm.use_kl_in_reward="
                "false; set algorithm.use_kl_in_reward=true or algorithm.kl_ctrl=fixed"
            )
        if a.kl_target <= 0:
            problems.append(f"algorithm.kl_target={a.kl_target} must be > 0; e.g. 0.1")
        at_least(problems, "algorithm.kl_horizon", a.kl_horizon, 1, "e.g. 10000")
    if a.value_clip <= 0:
        problems.append(f"algorithm.value_clip={a.value_clip} must be > 0; e.g. 0.5")
    at_least(problems, "algorithm.entropy_coeff", a.entropy_coeff, 0, "e.g. 0")
    at_least(problems, "algorithm.ppo_epochs", a.ppo_epochs, 1, "e.g. 1")
    at_least(problems, "algorithm.ppo_mini_batch_size", a.ppo_mini_batch_size, 1, "e.g. 16 prompts")


def _check_rollout_correction(rc: Any, problems: list[str]) -> None:
    key = "algorithm.rollout_correction"
    if rc.rollout_is is not None and rc.rollout_is_threshold <= 1:
        problems.append(
            f"{key}.rollout_is_threshold={rc.rollout_is_threshold} must be > 1 (IS weights are truncated "
            "at it); e.g. 2.0"
        )
    if rc.rollout_rs is not None and rc.rollout_rs.endswith(("_k2", "_k3")):  # verl 0.9: divergence bound
        upper = rc.rollout_rs_threshold
        if upper is None or upper <= 0:
            problems.append(
                f"{key}.rollout_rs={rc.rollout_rs} drops what exceeds {key}.rollout_rs_threshold (a divergence "
                f"bound), which is {upper}; set it > 0, e.g. {key}.rollout_rs_threshold=0.01"
            )
        if rc.rollout_rs_threshold_lower is not None:
            problems.append(
                f"{key}.rollout_rs={rc.rollout_rs} has no lower bound; unset {key}.rollout_rs_threshold_lower"
            )
    elif rc.rollout_rs is not None:
        upper, lower = rc.rollout_rs_threshold, rc.rollout_rs_threshold_lower
        if upper is None or upper <= 1:
            problems.append(
                f"{key}.rollout_rs={rc.rollout_rs} keeps ratios up to {key}.rollout_rs_threshold, which is "
                f"{upper}; set it > 1, e.g. {key}.rollout_rs_threshold=2.0"
            )
        elif lower is not None and not 0 < lower < upper:
            problems.append(
                f"{key}.rollout_rs_threshold_lower={lower} must be in (0, rollout_rs_threshold={upper}); "
                "e.g. 0.5, or null for 1 / rollout_rs_threshold"
            )
    veto = rc.rollout_token_veto_threshold
    if veto is not None and not 0 < veto < 1:
        problems.append(f"{key}.rollout_token_veto_threshold={veto} must be in (0, 1); e.g. 1e-4, or null")
    if rc.bypass_mode and (rc.rollout_is is not None or rc.rollout_rs is not None):
        problems.append(
            f"{key}.bypass_mode=true uses the engine's log-probs as the old ones, and megarl's rollout_is / "
            "rollout_rs weight and reject by old/rollout, which is then exactly 1 (verl computes them from "
            "π_θ/π_rollout inside the loss instead, which megarl does not offer); the mismatch still reaches "
            f"the PPO ratio π_θ/π_rollout, which clipping bounds. Unset {key}.rollout_is and "
            f"{key}.rollout_rs, or set bypass_mode=false to weight by old/rollout"
        )


def _check_preference(cfg: MegarlConfig, problems: list[str]) -> None:
    p, name = cfg.preference, cfg.algorithm.name
    if p.beta is not None and p.beta <= 0:
        problems.append(f"preference.beta={p.beta} must be > 0; e.g. 0.1 (simpo: 2.0)")
    eps = p.label_smoothing
    in_range(
        problems, "preference.label_smoothing", eps, "[0, 0.5)", 0 <= eps < 0.5, "e.g. 0.1, or 0 for off"
    )
    for key in ("desirable_weight", "undesirable_weight"):
        at_least(problems, f"preference.{key}", getattr(p, key), 0.0, "e.g. 1.0")
    if name in REFERENCE_ALGORITHMS and not cfg.ref.enable:
        problems.append(
            f"algorithm.name={name} compares the policy with the reference model, but ref.enable=false; "
            "remove ref.enable (auto turns it on)"
        )
    if name not in REFERENCE_ALGORITHMS and cfg.ref.enable:
        problems.append(
            f"algorithm.name={name} uses no reference model, but ref.enable=true would start one; remove "
            "ref.enable"
        )
    if p.precompute_ref and name not in REFERENCE_ALGORITHMS:
        problems.append(f"preference.precompute_ref=true, but algorithm.name={name} has no reference model")
    if p.label_smoothing and name not in ("dpo", "simpo"):
        problems.append(
            f"preference.label_smoothing={p.label_smoothing} applies to dpo and simpo only, not {name}"
        )
