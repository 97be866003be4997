"""rollout.placement and async_training in the config: the engines' own pool and the rules checked before
anything starts (megarl.config.async_checks, megarl.config.placement)."""

import pytest

from megarl.config import ConfigError, load_config
from megarl.config.placement import placement
from megarl.config.validate import resolve_auto

RAY4 = [
    "model.path=/m",
    "trainer.launcher=ray",
    "trainer.n_devices_per_node=4",
    "algorithm.name=grpo",
    "rollout.n=4",
]
SEPARATE = [*RAY4, "rollout.placement=separate", "actor.n_devices=2", "rollout.n_devices=2"]
ONE_UPDATE = ["algorithm.ppo_mini_batch_size=64"]  # one optimizer step per step: fused allowed


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides), check_paths=False)
    return info.value.problems


def test_a_separate_pool_is_its_own_ray_pool_beside_the_actor():
    cfg = resolve_auto(load_config(None, [*SEPARATE, "async_training.max_staleness=1"], check_paths=False))
    pools = {pool.roles: pool.size for pool in placement(cfg).pools}
    assert pools == {("actor",): 2, ("rollout",): 2}
    # async: the proximal policy is recomputed (not fused) and the engine's (behaviour) log-probs kept
    assert cfg.algorithm.old_log_prob == "recompute"
    assert cfg.rollout.calculate_log_probs is True
    sync = resolve_auto(load_config(None, [*SEPARATE, *ONE_UPDATE], check_paths=False))
    assert sync.algorithm.old_log_prob == "fused"  # max_staleness 0: as a colocated run decides


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            [*RAY4, "rollout.placement=separate"],
            "rollout.placement=separate needs the engines' devices: set rollout.n_devices (a pool of that "
            "many) or rollout.devices, and leave them out of the actor's (actor.n_devices or actor.devices)",
        ),
        (
            [*RAY4, "rollout.placement=separate", "rollout.n_devices=1"],
            "rollout.placement=separate gives the engines 1 device(s) of their own, but the actor takes the "
            "whole cluster (4 devices: actor.n_devices and actor.devices unset); set actor.n_devices=3",
        ),
        (
            [*RAY4, "rollout.placement=separate", "actor.n_devices=2", "rollout.devices=[cpu:1]"],
            "rollout.placement=separate, but the engines' devices [cpu:1] are the actor's ([cpu:0, cpu:1], "
            "the first 2 of the cluster (actor.n_devices=2)); give the engines devices the actor does not "
            "use (actor.n_devices or actor.devices), or use rollout.placement=colocated",
        ),
        (
            [*SEPARATE, "trainer.launcher=torchrun", "actor.n_devices=null", "trainer.n_devices_per_node=2"],
            "rollout.placement=separate needs trainer.launcher=ray: under torchrun every role runs in each "
            "process, so the engines cannot have devices of their own; set trainer.launcher=ray or "
            "rollout.placement=colocated",
        ),
        (
            [*SEPARATE, "rollout.n_devices=2", "rollout.tp=3"],
            "the engines' pool has 2 device(s) (rollout.n_devices or rollout.devices), not a multiple of "
            "rollout.tp=3: every engine needs rollout.tp devices; use 3 devices or another rollout.tp",
        ),
        (
            [*SEPARATE, "actor.backend=fsdp"],
            "rollout.placement=separate sends the weights from Megatron training shards; actor.backend=fsdp "
            "is not supported there yet: use actor.backend=megatron or rollout.placement=colocated",
        ),
        (
            [*RAY4, "async_training.max_staleness=1"],
            "async_training.max_staleness=1 needs rollout.placement=separate (the engines generate on devices "
            "of their own while the actor trains); set it, with rollout.n_devices, or set "
            "async_training.max_staleness=0",
        ),
        (
            [*SEPARATE, "async_training.partial_rollout=true"],
            "async_training.partial_rollout=true continues requests across a weight sync that happens while "
            "the engines generate, which needs async_training.max_staleness ≥ 1; set it or partial_rollout=false",
        ),
        (
            [*SEPARATE, "async_training.max_staleness=-1"],
            "async_training.max_staleness=-1 must be ≥ 0 (0 = synchronous, 1 = one step off-policy, K = up to "
            "K versions behind)",
        ),
        (
            [*RAY4, "rollout.n_devices=2"],
            "rollout.n_devices=2 places the engines on devices of their own, but rollout.placement=colocated "
            "runs them inside the actor's processes; set rollout.placement=separate or rollout.n_devices=null",
        ),
        (
            [
                *SEPARATE,
                "async_training.max_staleness=1",
                "algorithm.old_log_prob=fused",
                "algorithm.ppo_mini_batch_size=64",
            ],
            "algorithm.old_log_prob=fused, but async_training.max_staleness=1 (the samples come from older "
            "weights: the proximal policy is recomputed)",
        ),
    ],
    ids=lambda v: v[-1].split("=")[0] if isinstance(v, list) else None,
)
def test_each_misconfiguration_is_named_with_its_fix(overrides, message):
    found = problems(*overrides)
    assert any(p.startswith(message) for p in found), found
