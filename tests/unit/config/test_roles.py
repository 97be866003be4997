"""role_spec: each role's resolved settings, and the rules that tie one role to another."""

import pytest

from megarl.config.roles import role_spec, rollout_spec
from megarl.config.schema import MegarlConfig

pytestmark = pytest.mark.unit


def config() -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = "/models/policy", "fp32"
    cfg.trainer.n_devices_per_node = 4
    cfg.actor.parallel.tp, cfg.actor.parallel.pp, cfg.actor.n_devices = 2, 2, 4
    cfg.actor.offload_dir, cfg.actor.offload_optimizer = "/nvme/actor", True
    cfg.actor.micro_batch_size = 4
    cfg.ref.micro_batch_size, cfg.ref.offload_params = 8, True
    cfg.critic.parallel.tp, cfg.critic.n_devices, cfg.critic.offload_dir = 4, 2, "/nvme/critic"
    cfg.rollout.n, cfg.algorithm.ppo_mini_batch_size, cfg.algorithm.ppo_epochs = 4, 8, 2
    return cfg


def test_the_reference_shares_the_actors_layout_devices_and_offload_dir_but_batches_itself():
    cfg = config()
    ref, actor = role_spec(cfg, "ref"), role_spec(cfg, "actor")
    assert (ref.parallel, ref.n_devices, ref.offload.dir) == (actor.parallel, 4, "/nvme/actor")
    assert ref.micro_batch_size == 8 and ref.offload.params and not ref.offload.optimizer
    assert not ref.trainable and ref.algorithm is None and ref.rollout is None and not ref.recompute


def test_the_actor_spec_carries_its_training_and_rollout_settings():
    cfg = config()
    cfg.model.gradient_checkpointing, cfg.trainer.total_steps = True, 30
    actor = role_spec(cfg, "actor")
    assert actor.trainable and actor.recompute and actor.total_steps == 30
    assert (actor.mini_batch_size, actor.epochs) == (32, 2)  # ppo_mini_batch_size × rollout.n
    assert actor.offload.optimizer and actor.offload.dir == "/nvme/actor"
    assert actor.rollout == rollout_spec(cfg) and actor.rollout.seed == cfg.trainer.seed
    assert role_spec(cfg, "actor", total_steps=7).total_steps == 7


def test_the_critic_starts_from_the_policy_unless_it_names_a_checkpoint():
    cfg = config()
    critic = role_spec(cfg, "critic")
    assert critic.model.path == "/models/policy" and critic.parallel.tp == 4 and critic.n_devices == 2
    assert critic.rollout is None and critic.offload.dir == "/nvme/critic"
    cfg.critic.model_path = "/models/critic"
    assert role_spec(cfg, "critic").model.path == "/models/critic"


def test_frozen_roles_get_no_optimizer_and_recompute_only_when_trained():
    cfg = config()
    cfg.model.gradient_checkpointing, cfg.reward.model_path = True, "/models/rm"
    reward = role_spec(cfg, "reward")
    assert reward.optimizer is None and not reward.recompute and reward.n_devices == 4
    assert reward.model.path == "/models/rm" and reward.model.tokenizer_path == "/models/policy"


def test_the_spec_is_a_copy_of_the_config():
    cfg = config()
    actor = role_spec(cfg, "actor")
    cfg.actor.parallel.tp, cfg.actor.optimizer.lr = 1, 1.0
    assert actor.parallel.tp == 2 and actor.optimizer.lr != 1.0


def test_missing_checkpoints_and_unknown_roles_are_refused():
    with pytest.raises(ValueError, match="reward.model_path is not set"):
        role_spec(config(), "reward")
    with pytest.raises(ValueError, match="model.path is not set"):
        role_spec(MegarlConfig(), "actor")
    with pytest.raises(ValueError, match="unknown role 'policy'"):
        role_spec(config(), "policy")


def test_every_role_builds_fresh_weights_from_the_trainer_seed():
    cfg = config()
    cfg.trainer.seed = 7
    assert {role_spec(cfg, role).seed for role in ("actor", "ref", "critic")} == {7}
