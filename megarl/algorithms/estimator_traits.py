"""What each advantage estimator needs from the rest of a training step, by estimator name.

Torch-free, so config validation reads it without importing torch. `advantages.ESTIMATORS` holds the
functions under the same names; tests/unit/config/test_vocabulary.py keeps the two tables, the traits
and the estimators' signatures, and the schema's `AdvEstimator` in agreement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimatorTraits:
    needs_critic: bool = False  # takes the critic's `values`: the critic must run
    needs_group: bool = False  # compares the samples of one prompt (`group_ids`): rollout.n ≥ 2
    # takes `old_log_probs` and `sum_pi_squared` (Σ_v π_v² of each token's distribution): the actor's
    # log-prob pass must also report Σπ²
    needs_sum_pi_squared: bool = False
    # divides by the group std unless algorithm.norm_adv_by_std_in_grpo=false (verl applies that flag to
    # grpo and grpo_passk only), passed as the estimator's `norm_by_std`
    std_norm_flag: bool = False


ESTIMATOR_TRAITS: dict[str, EstimatorTraits] = {
    "gae": EstimatorTraits(needs_critic=True),
    "grpo": EstimatorTraits(needs_group=True, std_norm_flag=True),
    "drgrpo": EstimatorTraits(needs_group=True),
    "rloo": EstimatorTraits(needs_group=True),
    "reinforce_plus_plus": EstimatorTraits(),
    "reinforce_plus_plus_baseline": EstimatorTraits(needs_group=True),
    "remax": EstimatorTraits(),
    "grpo_passk": EstimatorTraits(needs_group=True, std_norm_flag=True),
    "opo": EstimatorTraits(needs_group=True),
    "gpg": EstimatorTraits(needs_group=True),
    "optimal_token_baseline": EstimatorTraits(needs_group=True, needs_sum_pi_squared=True),
}

CRITIC_ESTIMATORS = tuple(name for name, t in ESTIMATOR_TRAITS.items() if t.needs_critic)
GROUP_ESTIMATORS = tuple(name for name, t in ESTIMATOR_TRAITS.items() if t.needs_group)
