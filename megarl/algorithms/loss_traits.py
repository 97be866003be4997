"""What each policy loss takes besides the common arguments, by `algorithm.policy_loss` name.

Torch-free, so config validation reads it without importing torch. `policy_loss.POLICY_LOSSES` holds
the functions under the same names; tests/unit/config/test_vocabulary.py keeps the tables in agreement.
"""

from __future__ import annotations

# loss name -> its own keyword parameters and their defaults: verl's names and defaults (actor.tau_pos /
# tau_neg; actor.policy_loss.clip_cov_* / kl_cov_ratio / ppo_kl_coef); set with algorithm.policy_loss_params
LOSS_PARAMS: dict[str, dict[str, float]] = {
    "vanilla": {},
    "gspo": {},
    "cispo": {},
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
    "gpg": {},
    "reinforce": {},
    "geo_mean": {},
    "clip_cov": {"clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
    "kl_cov": {"kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1},
}

# losses whose objective is a mean over sequences of token means: algorithm.loss_agg_mode defaults to
# "seq-mean-token-mean" for them (verl hard-codes that mode for both)
SEQUENCE_MEAN_LOSSES = ("gspo", "sapo")

# losses that take the dual-clip cap algorithm.clip_ratio_c (the others ignore it, as in verl)
DUAL_CLIP_LOSSES = ("vanilla",)
