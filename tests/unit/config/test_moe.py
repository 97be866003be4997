"""`actor.router_replay` in the config: verl's key lands on it, and the modes that replay routes are
refused, with the fix, where megarl cannot honour them (megarl.config.moe_checks)."""

import pytest

from megarl.config import ConfigError, load_config
from megarl.config.moe_checks import check_router_replay
from megarl.config.parallel_checks import ModelDims
from megarl.config.schema import MegarlConfig

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


def test_r3_asks_the_engine_for_routes():
    from megarl.config.roles import rollout_spec

    assert rollout_spec(load("actor.router_replay.mode=R3")).return_routes
    assert not rollout_spec(load("actor.router_replay.mode=R2")).return_routes
