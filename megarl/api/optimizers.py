"""Placeholder until the optimizer mapping lands (branch optim)."""

from __future__ import annotations

from typing import Any

from megarl.config.schema import OptimizerConfig


def optimizer_config(optimizer: Any) -> OptimizerConfig:
    if isinstance(optimizer, OptimizerConfig):
        return optimizer
    return OptimizerConfig(**optimizer)
