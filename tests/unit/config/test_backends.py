"""`<role>.backend` in the config: verl's `strategy` and fsdp_config keys, and the rules checked before
anything starts (megarl.config.backend_checks)."""

import pytest

from megarl.config import ConfigError, load_config
from megarl.config.roles import role_spec


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.path=/m", *overrides], check_paths=False)
    return info.value.problems


def test_verl_strategy_and_fsdp_config_keys_set_the_backend():
    cfg = load_config(
        None,
        [
            "model.path=/m",
            "actor_rollout_ref.actor.strategy=fsdp2",
            "critic.strategy=fsdp",
            "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",
            "actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[LlamaDecoderLayer]",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "trainer.n_devices_per_node=2",
        ],
        check_paths=False,
    )
    assert (cfg.actor.backend, cfg.critic.backend, cfg.backend_of("ref")) == ("fsdp", "fsdp", "fsdp")
    assert cfg.actor.fsdp.reshard_after_forward is False
    assert cfg.actor.fsdp.wrap_classes == ["LlamaDecoderLayer"]
    assert cfg.actor.parallel.tp == 1  # an FSDP actor's engines need no training TP (verl's habit kept)
    assert cfg.rollout.tp == 2
    assert role_spec(cfg, "ref").backend == "fsdp"
    with pytest.raises(
        ConfigError, match="strategy='deepspeed' is not one megarl runs; use fsdp, fsdp2 or megatron"
    ):
        load_config(None, ["model.path=/m", "actor_rollout_ref.actor.strategy=deepspeed"], check_paths=False)


def test_an_fsdp_role_is_data_parallel_only():
    found = problems(
        "actor.backend=fsdp", "actor.parallel.tp=2", "trainer.n_devices_per_node=2", "rollout.tp=1"
    )
    assert (
        "actor.backend=fsdp is data parallel only (FSDP shards every parameter over the role's devices), but "
        "actor.parallel.tp=2; set them to 1 (vpp null, sequence_parallel false) or use actor.backend=megatron for "
        "tensor, pipeline, context or expert parallelism"
    ) in found


def test_mixed_backends_in_one_process_need_the_fsdp_layout():
    found = problems(
        "actor.parallel.tp=2",
        "ref.backend=fsdp",
        "algorithm.use_kl_loss=true",
        "trainer.n_devices_per_node=2",
    )
    assert (
        "ref.backend=fsdp runs in the actor's processes (actor.backend=megatron), which hold one megatron layout; "
        "an FSDP role needs it at tp = pp = cp = 1, but actor.parallel.tp=2. Give the role devices of its own "
        "(trainer.launcher=ray) or use one backend"
    ) in found
    # at TP1 the two backends share the processes
    load_config(None, ["model.path=/m", "ref.backend=fsdp", "algorithm.use_kl_loss=true"], check_paths=False)


def test_rollout_tp_of_an_fsdp_actor_divides_its_devices():
    found = problems("actor.backend=fsdp", "trainer.n_devices_per_node=3", "rollout.tp=2")
    assert (
        "rollout.tp=2 does not divide the FSDP actor's world of 3 ranks (each generation replica is a run of "
        "rollout.tp consecutive ranks); use one of 1, 3"
    ) in found
