"""DeviceMap: a role's devices and layout as a Python value, checked when built, written into the config
by `apply` so that the Python API and a YAML file take the same path through validation."""

import pytest

from megarl.config import ConfigError, load_config, validate
from megarl.config.placement import placement
from megarl.config.schema import MegarlConfig, ParallelConfig
from megarl.controller.device_map import DeviceMap

pytestmark = pytest.mark.unit


def _ppo() -> MegarlConfig:
    overrides = [
        "model.path=/models/policy",
        "algorithm.name=ppo",
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_loss=true",
        "data.train_batch_size=8",
        "algorithm.ppo_mini_batch_size=8",
        "rollout.n=4",
        "trainer.n_devices_per_node=4",
    ]
    return load_config(None, overrides, check_paths=False)


def test_megarl_single_and_dp_maps_give_their_layouts():
    m = DeviceMap(strategy="megatron", devices=["cuda:0", "cuda:1", "cuda:2", "cuda:3"], tp=2)
    assert m.devices == ("cuda:0", "cuda:1", "cuda:2", "cuda:3") and m.world_size == 4
    assert m.parallel == ParallelConfig(tp=2)
    assert DeviceMap("single", ["cpu:3"]).parallel == ParallelConfig()
    assert DeviceMap("dp", ["node:1/cuda:0", "node:1/cuda:1"]).world_size == 2
    assert DeviceMap("megatron", ["cpu:0", "cpu:1"], pp=2, vpp=2).parallel == ParallelConfig(pp=2, vpp=2)
    assert hash(m) == hash(DeviceMap(devices=("cuda:0", "cuda:1", "cuda:2", "cuda:3"), tp=2))


def test_an_fsdp_map_puts_the_role_on_the_fsdp_backend():
    cfg = MegarlConfig()
    DeviceMap("fsdp", ["cpu:0", "cpu:1"]).apply(cfg, "critic")
    assert (cfg.critic.backend, cfg.critic.devices, cfg.critic.parallel.tp) == ("fsdp", ["cpu:0", "cpu:1"], 1)
    assert cfg.actor.backend == "megatron"


def test_apply_writes_the_config_and_python_equals_yaml():
    cfg = _ppo()
    DeviceMap("megatron", ["cpu:0", "cpu:1"], tp=2).apply(cfg, "actor")
    DeviceMap("dp", ["cpu:2", "cpu:3"]).apply(cfg, "ref")
    assert DeviceMap("single", ["cpu:0"]).apply(cfg, "critic") is cfg
    DeviceMap("megatron", ["cpu:0", "cpu:1"]).apply(cfg, "critic")
    validate(cfg, check_paths=False)
    assert (cfg.actor.devices, cfg.actor.parallel, cfg.actor.n_devices) == (
        ["cpu:0", "cpu:1"],
        ParallelConfig(tp=2),
        None,
    )
    pools = [(p.roles, p.size) for p in placement(cfg).pools]
    assert pools == [(("actor", "critic"), 2), (("ref",), 2)]
    from_yaml = load_config(
        None,
        [
            "model.path=/models/policy",
            "algorithm.name=ppo",
            "algorithm.adv_estimator=gae",
            "algorithm.use_kl_loss=true",
            "data.train_batch_size=8",
            "algorithm.ppo_mini_batch_size=8",
            "rollout.n=4",
            "trainer.n_devices_per_node=4",
            "actor.devices=[cpu:0,cpu:1]",
            "actor.parallel.tp=2",
            "ref.devices=[cpu:2,cpu:3]",
            "ref.parallel.tp=1",
            "critic.devices=[cpu:0,cpu:1]",
        ],
        check_paths=False,
    )
    assert from_yaml == cfg


def test_an_applied_map_is_checked_with_the_other_roles_by_validate():
    cfg = DeviceMap("dp", ["cpu:1", "cpu:2"]).apply(_ppo(), "critic")
    DeviceMap("dp", ["cpu:0", "cpu:1"]).apply(cfg, "actor")
    with pytest.raises(ConfigError) as info:
        validate(cfg, check_paths=False)
    assert info.value.problems == [
        "critic.devices=[cpu:1, cpu:2] shares cpu:1 with the actor's devices (actor.devices=[cpu:0, cpu:1]) but "
        "not all of them; roles share all their devices (colocated) or none (a pool each): use "
        "critic.devices=[cpu:0, cpu:1], or devices no other role uses (cpu:3)"
    ]
    with pytest.raises(ValueError, match="unknown role 'policy'"):
        DeviceMap("single", ["cpu:0"]).apply(cfg, "policy")


INVALID = [
    (
        dict(strategy="fsdp", devices=["cuda:0", "cuda:1"], tp=2),
        "DeviceMap(strategy='fsdp', devices=[cuda:0, cuda:1]): strategy='fsdp' has no model parallelism, but tp=2 "
        "is set; use strategy='megatron' for it, or drop it",
    ),
    (
        dict(strategy="zero3", devices=["cuda:0"]),
        "DeviceMap(strategy='zero3', devices=[cuda:0]): unknown strategy; use one of 'megatron', 'single', 'dp', 'fsdp'",
    ),
    (
        dict(strategy="megatron", devices=[]),
        "DeviceMap(strategy='megatron', devices=[]) lists no device; give at least one, e.g. devices=['cuda:0']",
    ),
    (
        dict(devices=["cuda:0", "gpu1"]),
        "DeviceMap(strategy='megatron', devices=[cuda:0, gpu1]): 'gpu1' is not a device; write cuda:N, "
        "node:K/cuda:N or cpu:N (N, K ≥ 0)",
    ),
    (
        dict(strategy="single", devices=["cuda:0", "cuda:1"]),
        "DeviceMap(strategy='single', devices=[cuda:0, cuda:1]): strategy='single' runs on exactly one device, "
        "not 2; list one, or use strategy='dp' (or 'megatron') for several",
    ),
    (
        dict(strategy="dp", devices=["cuda:0", "cuda:1"], tp=2),
        "DeviceMap(strategy='dp', devices=[cuda:0, cuda:1]): strategy='dp' has no model parallelism, but tp=2 is "
        "set; use strategy='megatron' for it, or drop it",
    ),
    (
        dict(devices=["cuda:0", "cuda:1", "cuda:2"], tp=2),
        "DeviceMap(strategy='megatron', devices=[cuda:0, cuda:1, cuda:2]): tp·pp·cp = 2·1·1 = 2 does not divide "
        "the 3 devices; make tp·pp·cp one of 1, 3 or use a multiple of 2 devices",
    ),
    (
        dict(devices=["cuda:0", "cuda:1"], vpp=2),
        "DeviceMap(strategy='megatron', devices=[cuda:0, cuda:1]): vpp=2 needs pp > 1; set vpp=null or raise pp",
    ),
]


@pytest.mark.parametrize("kwargs, message", INVALID, ids=[str(n) for n in range(len(INVALID))])
def test_an_invalid_map_is_refused_when_built(kwargs, message):
    with pytest.raises(ConfigError) as info:
        DeviceMap(**kwargs)
    assert info.value.problems == [message]
