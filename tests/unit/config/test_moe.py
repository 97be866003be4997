"""`actor.router_replay` in the config: verl's key lands on it, and the modes that replay routes are
refused, with the fix, where megarl cannot honour them (megarl.config.moe_checks); `<role>.moe`'s router
losses: verl's megatron overrides land on them and they reach megatron's TransformerConfig fields."""

import pytest

from megarl.config import ConfigError, load_config
from megarl.config.moe_checks import check_rollout_expert_parallel, check_router_replay
from megarl.config.parallel_checks import ModelDims
from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.config.schema_moe import MoeRouterConfig
from megarl.models.from_hf import ModelArchitecture
from megarl.models.tiny import tiny_config

pytestmark = pytest.mark.unit


def load(*overrides: str) -> MegarlConfig:
    return load_config(None, ["model.path=/m", *overrides], check_paths=False)


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    return info.value.problems


def dims(num_experts: int) -> ModelDims:
    return ModelDims(
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=128,
        num_experts=num_experts,
    )


def test_router_replay_is_off_by_default_and_verls_key_sets_it():
    assert load().actor.router_replay.mode == "disabled"
    assert load("actor_rollout_ref.actor.router_replay.mode=R3").actor.router_replay.mode == "R3"
    assert load("actor.router_replay.mode=R2").actor.router_replay.mode == "R2"
    assert any(
        "actor.router_replay.mode" in p and "R2, R3" in p for p in problems("actor.router_replay.mode=R4")
    )


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_a_dense_model_is_refused_and_an_moe_model_is_not(mode):
    cfg = load(f"actor.router_replay.mode={mode}")
    found: list[str] = []
    check_router_replay(cfg, dims(0), found)
    assert len(found) == 1 and "dense model" in found[0] and "actor.router_replay.mode=disabled" in found[0]
    found = []
    check_router_replay(cfg, dims(8), found)
    assert found == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor.backend=fsdp"], "actor.backend=megatron"),
        (["ref.enable=true", "ref.backend=fsdp"], "ref.backend=megatron"),
        (
            ["model.gradient_checkpointing=true", "actor.parallel.pp=2", "trainer.n_devices_per_node=2"],
            "model.gradient_checkpointing=false",
        ),
        (["algorithm.rollout_correction.bypass_mode=true"], "bypass_mode=false"),
        (["critic.router_replay.mode=R3"], "critic.router_replay.mode=disabled"),
    ],
)
def test_what_replay_cannot_do_is_refused_with_the_fix(overrides, message):
    found = problems("actor.router_replay.mode=R2", *overrides)
    assert any(message in p for p in found), found


@pytest.mark.parametrize(
    ("field", "message"),
    [("multi_turn", "rollout.multi_turn.enable=false"), ("partial", "async_training.partial_rollout=false")],
)
def test_r3_refuses_rollouts_whose_routes_the_engine_does_not_record(field, message):
    cfg = load("actor.router_replay.mode=R3")
    if field == "multi_turn":
        cfg.rollout.multi_turn.enable = True
    else:
        cfg.async_training.partial_rollout = True
    found: list[str] = []
    check_router_replay(cfg, dims(8), found)
    assert len(found) == 1 and message in found[0], found
    cfg.actor.router_replay.mode = "R2"
    found = []
    check_router_replay(cfg, dims(8), found)
    assert found == []


def test_verls_rollout_expert_parallel_size_sets_the_engines_expert_parallelism():
    assert load().rollout.expert_parallel_size == 1
    cfg = load(
        "actor_rollout_ref.rollout.expert_parallel_size=2",
        "rollout.tp=2",
        "actor.parallel.tp=2",
        "trainer.n_devices_per_node=2",
    )
    assert cfg.rollout.expert_parallel_size == 2
    found: list[str] = []
    check_rollout_expert_parallel(cfg, dims(4), found)
    assert found == []


@pytest.mark.parametrize(
    ("overrides", "experts", "message"),
    [
        ([], 4, "must equal rollout.tp=1"),
        (["rollout.tp=2", "actor.parallel.tp=2"], 0, "dense model"),
        (["rollout.tp=2", "actor.parallel.tp=2"], 3, "does not divide the model's 3 routed experts"),
    ],
)
def test_engine_expert_parallelism_is_refused_where_it_cannot_work(overrides, experts, message):
    cfg = load("trainer.n_devices_per_node=2", *overrides)
    cfg.rollout.expert_parallel_size = 2
    found: list[str] = []
    check_rollout_expert_parallel(cfg, dims(experts), found)
    assert len(found) == 1 and message in found[0], found


def test_only_the_megatron_actors_colocated_engine_gets_its_experts_in_blocks():
    cfg = load("trainer.n_devices_per_node=2", "rollout.tp=2", "actor.parallel.tp=2")
    cfg.rollout.expert_parallel_size, cfg.rollout.placement = 2, "separate"
    found: list[str] = []
    check_rollout_expert_parallel(cfg, dims(4), found)
    assert len(found) == 1 and "rollout.placement=colocated" in found[0], found


def test_r3_asks_the_engine_for_routes():
    from megarl.config.roles import rollout_spec

    assert rollout_spec(load("actor.router_replay.mode=R3")).return_routes
    assert not rollout_spec(load("actor.router_replay.mode=R2")).return_routes


def test_router_losses_default_to_the_checkpoints_and_verls_megatron_overrides_set_them():
    assert load().actor.moe == MoeRouterConfig()
    verl = "actor_rollout_ref.actor.megatron.override_transformer_config"
    cfg = load(
        f"{verl}.moe_aux_loss_coeff=0.01",
        f"{verl}.moe_z_loss_coeff=0.001",
        f"{verl}.moe_router_load_balancing_type=seq_aux_loss",
        "critic.megatron.override_transformer_config.moe_aux_loss_coeff=0.02",
    )
    assert cfg.actor.moe == MoeRouterConfig(0.01, 0.001, "seq_aux_loss")
    assert cfg.critic.moe.aux_loss_coeff == 0.02
    assert role_spec(cfg, "actor").moe == cfg.actor.moe and role_spec(cfg, "ref").moe == MoeRouterConfig()
    assert any("actor.moe.z_loss_coeff=-1.0 must be ≥ 0" in p for p in problems("actor.moe.z_loss_coeff=-1"))
    assert any(
        "sinkhorn" in p and "seq_aux_loss" in p for p in problems("actor.moe.load_balancing_type=sinkhorn")
    )


def test_router_losses_reach_megatrons_transformer_config_fields():
    hf = tiny_config("qwen3_moe").to_dict()
    arch = ModelArchitecture.from_hf_config(hf)
    assert arch.moe.transformer_config_fields()["moe_router_load_balancing_type"] == "none"  # no logits out
    logits_out = ModelArchitecture.from_hf_config({**hf, "output_router_logits": True})
    coef = hf["router_aux_loss_coef"]
    assert logits_out.moe.transformer_config_fields()["moe_aux_loss_coeff"] == coef
    assert logits_out.moe.transformer_config_fields()["moe_router_load_balancing_type"] == "aux_loss"
    fields = arch.with_router_losses(0.01, 0.001, None).moe.transformer_config_fields()
    assert (fields["moe_aux_loss_coeff"], fields["moe_z_loss_coeff"]) == (0.01, 0.001)
    assert fields["moe_router_load_balancing_type"] == "aux_loss"
    fields = logits_out.with_router_losses(None, None, "none").moe.transformer_config_fields()
    assert fields["moe_router_load_balancing_type"] == "none" and fields["moe_aux_loss_coeff"] == coef
    dense = ModelArchitecture.from_hf_config(tiny_config("qwen3").to_dict())
    assert dense.with_router_losses(0.01, None, None) is dense
