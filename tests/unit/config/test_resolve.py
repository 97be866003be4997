"""Fields the config derives when left unset (auto): they follow the algorithm, the loss and the
layout the way verl's users expect."""

from pathlib import Path

import pytest

from megarl.config import load_config, padded_vocab_size

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("overrides", "mode"),
    [
        ([], "token-mean"),
        (["algorithm.policy_loss=gspo"], "seq-mean-token-mean"),
        (["algorithm.policy_loss=sapo"], "seq-mean-token-mean"),
        (["algorithm.policy_loss=gspo", "algorithm.loss_agg_mode=token-mean"], "token-mean"),
    ],
)
def test_loss_agg_mode_auto_follows_the_loss(overrides, mode):
    cfg = load_config(None, overrides, check_paths=False)
    assert cfg.algorithm.loss_agg_mode == mode


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], False),  # verl's default: nothing reads them
        (["rollout.calculate_log_probs=true"], True),
        (
            [
                "algorithm.rollout_correction.rollout_rs=token",
                "algorithm.rollout_correction.rollout_rs_threshold=2",
            ],
            True,
        ),
        (["algorithm.rollout_correction.bypass_mode=true", "algorithm.policy_loss=reinforce"], True),
        (["algorithm.rollout_correction.rollout_token_veto_threshold=1e-4"], True),
    ],
)
def test_engine_log_probs_auto_follow_their_readers(overrides, expected):
    cfg = load_config(None, overrides, check_paths=False)
    assert cfg.rollout.calculate_log_probs is expected


def test_auto_roles_follow_the_algorithm():
    cfg = load_config(None, ["algorithm.name=ppo", "reward.model_path=/rm"], check_paths=False)
    assert cfg.algorithm.adv_estimator == "gae" and cfg.critic.enable and cfg.reward.enable
    assert not cfg.ref.enable


@pytest.mark.parametrize(
    ("name", "ref", "beta"),
    [("dpo", True, 0.1), ("kto", True, 0.1), ("orpo", False, 0.1), ("simpo", False, 2.0)],
)
def test_preference_algorithms_resolve_the_reference_and_beta(name, ref, beta):
    from megarl.algorithms.preference_terms import PreferenceSettings
    from megarl.trainer.preference import preference_config

    cfg = preference_config(load_config(None, [], check_paths=False), name)  # resolved as ppo first
    assert (cfg.ref.enable, cfg.critic.enable, PreferenceSettings.from_config(cfg).beta) == (ref, False, beta)
    assert load_config(None, [f"algorithm.name={name}"], check_paths=False).ref.enable == ref


def test_the_rm_job_starts_only_the_model_it_trains():
    from megarl.trainer.reward_model import rm_config
    from megarl.trainer.roles import enabled_roles

    rl = load_config(None, ["reward.model_path=/rm", "algorithm.name=ppo"], check_paths=False)
    assert {"critic", "reward"} <= set(enabled_roles(rl))
    cfg = rm_config(rl)
    assert cfg.algorithm.name == "rm" and enabled_roles(cfg) == ["actor"]
    # one optimizer step per batch of pairs: the RL mini-batch size does not apply
    quickstart = Path(__file__).resolve().parents[3] / "configs" / "quickstart_rm.yaml"
    loaded = load_config(quickstart, ["algorithm.ppo_mini_batch_size=1024"], check_paths=False)
    assert (loaded.algorithm.name, enabled_roles(loaded)) == ("rm", ["actor"])


@pytest.mark.parametrize(
    ("vocab", "divisible_by", "tp", "padded"),
    [
        (1001, 128, 1, 1024),
        (1001, 128, 4, 1024),
        (32000, 128, 4, 32256),
        (1024, 128, 8, 1024),
        (50257, 128, 1, 50304),
    ],
)
def test_padded_vocab_size(vocab, divisible_by, tp, padded):
    assert padded_vocab_size(vocab, divisible_by, tp) == padded
