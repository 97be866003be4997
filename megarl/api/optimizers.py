"""`optimizer_config`: what a controller's `optimizer=` accepts, as megarl's OptimizerConfig.

Megatron builds the optimizer itself (over its own fp32 main parameters, sharded or not), so a torch
optimizer given here is read for its hyper-parameters only; megarl never steps it. Those are mapped onto
megatron's AdamW, Adam or SGD (`OptimizerConfig.name`), and anything megatron would do differently is
refused with `UnsupportedOptimizerError` naming the optimizer and the setting.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from megarl.config.errors import ConfigError
from megarl.config.options import OptimizerName
from megarl.config.schema import OptimizerConfig
from megarl.config.validate import check_optimizer
from megarl.errors import EXIT_USAGE, MegarlError

__all__ = ["UnsupportedOptimizerError", "optimizer_config"]


class UnsupportedOptimizerError(MegarlError, ValueError):
    """A torch optimizer (or one of its settings) that megatron's optimizer cannot reproduce."""

    exit_code = EXIT_USAGE


# torch class -> megarl's name; exact classes only (a subclass may change the update)
_TORCH_CLASSES: dict[type[torch.optim.Optimizer], OptimizerName] = {
    torch.optim.AdamW: "adamw",
    torch.optim.Adam: "adam",
    torch.optim.SGD: "sgd",
}
# group settings that pick torch's kernel, not the update; megatron picks its own
_IGNORED = ("foreach", "fused", "capturable")
# group settings megatron has no equivalent for -> the value that leaves torch's update alone
_MUST_BE = {"amsgrad": False, "maximize": False, "differentiable": False, "nesterov": False, "dampening": 0}
# the group settings each family maps onto OptimizerConfig (same names there)
_MAPPED = {"adamw": ("lr", "betas", "eps", "weight_decay"), "sgd": ("lr", "momentum", "weight_decay")}


def optimizer_config(
    optimizer: Mapping[str, Any] | OptimizerConfig | torch.optim.Optimizer,
    *,
    base: OptimizerConfig | None = None,
) -> OptimizerConfig:
    """megarl's OptimizerConfig for a controller's `optimizer=` argument, checked.

    `optimizer` is one of:
      - a dict of OptimizerConfig keys (`{"lr": 1e-6, "name": "sgd", ...}`), applied over `base`; an unknown
        key raises ConfigError listing the valid ones;
      - an OptimizerConfig, returned as is once checked;
      - a `torch.optim.AdamW`, `Adam` or `SGD` instance, built over any parameters (an HF model's, or a
        dummy `[torch.nn.Parameter(torch.zeros(1))]`): only its hyper-parameters are read — lr, betas, eps
        and weight_decay (SGD: lr, momentum and weight_decay) — and megatron builds its own optimizer
        with them. `Adam(decoupled_weight_decay=True)` counts as AdamW. An LR scheduler attached to it is
        not carried over (the group's `initial_lr` is used as lr): set `lr_warmup_steps` /
        `lr_decay_style` in `base`. foreach, fused and capturable are ignored: they pick torch's kernel,
        not the update.

    The settings a torch optimizer has no word for (min_lr, clip_grad, the LR schedule,
    use_distributed_optimizer) come from `base` (default: OptimizerConfig's defaults); an SGD instance
    also sets use_distributed_optimizer=False, as megatron shards Adam only.

    One difference stays: megatron applies no weight decay to biases and norm weights (1-D parameters),
    where torch decays every parameter it was given. Param groups that differ only in weight_decay, one
    value and 0 (the usual decay / no-decay split, as Hugging Face's Trainer builds it), are taken as that
    value for this reason; any other difference between groups is refused.

    Raises UnsupportedOptimizerError for what megatron cannot reproduce: another optimizer class (or a
    subclass), amsgrad, maximize, differentiable, SGD nesterov or dampening ≠ 0, a hyper-parameter given
    as a tensor, groups with different hyper-parameters. Raises ConfigError for invalid values.
    """
    base = base if base is not None else OptimizerConfig()
    if isinstance(optimizer, OptimizerConfig):
        cfg = optimizer
    elif isinstance(optimizer, Mapping):
        cfg = _from_dict(optimizer, base)
    elif isinstance(optimizer, torch.optim.Optimizer):
        cfg = _from_torch(optimizer, base)
    else:
        raise UnsupportedOptimizerError(
            f"optimizer={type(optimizer).__name__} is not an optimizer: pass a dict of OptimizerConfig "
            "keys, an OptimizerConfig, or a torch.optim.AdamW, Adam or SGD instance"
        )
    problems: list[str] = []
    if cfg.name not in typing.get_args(OptimizerName):
        names = ", ".join(typing.get_args(OptimizerName))
        problems.append(f"optimizer.name={cfg.name} is invalid: expected one of {names}")
    check_optimizer("optimizer", cfg, problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def _from_dict(values: Mapping[str, Any], base: OptimizerConfig) -> OptimizerConfig:
    merged = OmegaConf.structured(base)
    valid = [f.name for f in dataclasses.fields(OptimizerConfig)]
    problems = []
    for key, value in values.items():
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(valid)}"
            problems.append(f"unknown key 'optimizer.{key}' — {hint}")
            continue
        try:
            merged = OmegaConf.merge(merged, {key: value})
        except OmegaConfBaseException as e:
            problems.append(f"optimizer.{key}={value!r} is invalid: {str(e).splitlines()[0]}")
    if problems:
        raise ConfigError(problems)
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, OptimizerConfig)
    return cfg


def _from_torch(optimizer: torch.optim.Optimizer, base: OptimizerConfig) -> OptimizerConfig:
    cls = type(optimizer).__name__
    family = _TORCH_CLASSES.get(type(optimizer))
    if family is None:
        raise UnsupportedOptimizerError(f"{cls} has no Megatron equivalent; use AdamW, Adam or SGD")
    settings = _one_setting(cls, [_group_settings(cls, family, g) for g in optimizer.param_groups])
    if family == "sgd":
        # megatron's distributed optimizer shards Adam only
        return dataclasses.replace(base, name="sgd", use_distributed_optimizer=False, **settings)
    decoupled = settings.pop("decoupled_weight_decay")
    return dataclasses.replace(base, name="adamw" if decoupled else "adam", **settings)


def _group_settings(cls: str, family: OptimizerName, group: dict[str, Any]) -> dict[str, Any]:
    """One param group's mapped settings, after refusing what megatron cannot reproduce."""
    for key, fine in _MUST_BE.items():
        if key in group and group[key] != fine:
            raise UnsupportedOptimizerError(
                f"{cls}({key}={group[key]}) has no Megatron equivalent; use {key}={fine} (of torch's other "
                f"settings, {', '.join(_IGNORED)} are ignored: they pick torch's kernel, not the update)"
            )
    # An LR scheduler rewrites `lr` (a warm-up starts it at 0) and keeps the given one as `initial_lr`.
    values = {**group, "lr": group.get("initial_lr", group["lr"])}
    settings = {key: _number(cls, key, values[key]) for key in _MAPPED["sgd" if family == "sgd" else "adamw"]}
    if family != "sgd":  # torch.optim.Adam(decoupled_weight_decay=True) is AdamW
        settings["betas"] = list(settings["betas"])
        settings["decoupled_weight_decay"] = bool(group.get("decoupled_weight_decay", family == "adamw"))
    return settings


def _one_setting(cls: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings all param groups share; a decay / no-decay split counts as its weight decay."""
    decays = sorted({g["weight_decay"] for g in groups})
    if len(decays) > 2 or (len(decays) == 2 and decays[0] != 0):
        raise UnsupportedOptimizerError(
            f"{cls} param groups have weight_decay={decays}; megatron's optimizer uses one value for all "
            "parameters (none on biases and norm weights)"
        )
    first = groups[0]
    for i, group in enumerate(groups[1:], start=1):
        for key, value in group.items():
            if key != "weight_decay" and value != first[key]:
                raise UnsupportedOptimizerError(
                    f"{cls} param group {i} has {key}={value} but group 0 has {key}={first[key]}; megatron's "
                    "optimizer uses one value for all parameters"
                )
    return {**first, "weight_decay": decays[-1]}


def _number(cls: str, key: str, value: Any) -> Any:
    """A float (betas: a tuple of floats); a tensor is refused."""
    items = value if isinstance(value, tuple | list) else (value,)
    if any(isinstance(v, torch.Tensor) for v in items):
        raise UnsupportedOptimizerError(
            f"{cls}({key}=<tensor>): megatron takes {key} as a number; pass a float"
        )
    return tuple(float(v) for v in items) if isinstance(value, tuple | list) else float(value)
