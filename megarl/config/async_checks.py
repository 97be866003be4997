"""The rules of rollout.placement and async_training, checked with the rest of the config before anything
starts: the engines' own pool holds whole engines, feeds a Megatron actor, and async training (samples
generated while the actor trains) needs that pool."""

from __future__ import annotations

from megarl.config.schema import MegarlConfig


def check_async(cfg: MegarlConfig, problems: list[str]) -> None:
    r, a = cfg.rollout, cfg.async_training
    separate = r.placement == "separate"
    if a.max_staleness < 0:
        problems.append(
            f"async_training.max_staleness={a.max_staleness} must be ≥ 0 (0 = synchronous, 1 = one step "
            "off-policy, K = up to K versions behind)"
        )
    if a.max_staleness > 0 and not separate:
        problems.append(
            f"async_training.max_staleness={a.max_staleness} needs rollout.placement=separate (the engines "
            "generate on devices of their own while the actor trains); set it, with rollout.n_devices, or "
            "set async_training.max_staleness=0"
        )
    if a.partial_rollout and a.max_staleness < 1:
        problems.append(
            "async_training.partial_rollout=true continues requests across a weight sync that happens while "
            "the engines generate, which needs async_training.max_staleness ≥ 1; set it or partial_rollout=false"
        )
    if not separate:
        for key, value in (("rollout.n_devices", r.n_devices), ("rollout.devices", r.devices)):
            if value is not None:
                problems.append(
                    f"{key}={value} places the engines on devices of their own, but rollout.placement="
                    "colocated runs them inside the actor's processes; set rollout.placement=separate or "
                    f"{key}=null"
                )
        return
    if cfg.actor.backend != "megatron":
        problems.append(
            f"rollout.placement=separate sends the weights from Megatron training shards; actor.backend="
            f"{cfg.actor.backend} is not supported there yet: use actor.backend=megatron or "
            "rollout.placement=colocated"
        )
    if cfg.algorithm.name == "rm":
        problems.append("algorithm.name=rm generates nothing; use rollout.placement=colocated")
    n = len(r.devices) if r.devices is not None else r.n_devices
    if n is not None and n >= 1 and r.tp >= 1 and n % r.tp:
        problems.append(
            f"the engines' pool has {n} device(s) (rollout.n_devices or rollout.devices), not a multiple of "
            f"rollout.tp={r.tp}: every engine needs rollout.tp devices; use {max(r.tp, n - n % r.tp)} devices "
            "or another rollout.tp"
        )
