"""megarl: Megatron-native reinforcement-learning post-training for large language models.

The public Python API is importable from here; each name loads its module on first use, so that
`import megarl` stays cheap and imports neither torch, megatron nor ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "load_config": "megarl.config.load",
    "ConfigError": "megarl.config.errors",
    "MegarlError": "megarl.errors",
    "MegarlConfig": "megarl.config.schema",
    "ParallelLayout": "megarl.distributed.layout",
    "Batch": "megarl.protocol",
    "Dispatch": "megarl.controller.dispatch",
    "register": "megarl.controller.dispatch",
    "Worker": "megarl.controller.worker",
    "WorkerError": "megarl.controller.worker",
    "RLTrainer": "megarl.trainer.rl_trainer",
    "SFTTrainer": "megarl.trainer.sft",
    "PreferenceTrainer": "megarl.trainer.preference",
    "DPOTrainer": "megarl.trainer.preference",
    "IPOTrainer": "megarl.trainer.preference",
    "KTOTrainer": "megarl.trainer.preference",
    "ORPOTrainer": "megarl.trainer.preference",
    "SimPOTrainer": "megarl.trainer.preference",
    "Dataflow": "megarl.api.flow",
    "Stage": "megarl.trainer.dataflow",
    "Port": "megarl.trainer.dataflow",
    "ActorController": "megarl.api.controllers",
    "CriticController": "megarl.api.controllers",
    "ReferenceController": "megarl.api.controllers",
    "RewardController": "megarl.api.controllers",
    "PPOTrainer": "megarl.api.trainers",
    "GRPOTrainer": "megarl.api.trainers",
    "Roles": "megarl.api.trainers",
    "DeviceMap": "megarl.controller.device_map",
}

__all__ = [
    "ActorController",
    "CriticController",
    "GRPOTrainer",
    "PPOTrainer",
    "Port",
    "ReferenceController",
    "RewardController",
    "Roles",
    "Batch",
    "ConfigError",
    "DeviceMap",
    "Dispatch",
    "MegarlConfig",
    "MegarlError",
    "ParallelLayout",
    "RLTrainer",
    "SFTTrainer",
    "PreferenceTrainer",
    "DPOTrainer",
    "IPOTrainer",
    "KTOTrainer",
    "ORPOTrainer",
    "SimPOTrainer",
    "Stage",
    "Dataflow",
    "Worker",
    "WorkerError",
    "__version__",
    "load_config",
    "register",
]

if TYPE_CHECKING:
    from megarl.api.controllers import (
        ActorController,
        CriticController,
        ReferenceController,
        RewardController,
    )
    from megarl.api.flow import Dataflow
    from megarl.api.trainers import GRPOTrainer, PPOTrainer, Roles
    from megarl.config.errors import ConfigError
    from megarl.config.load import load_config
    from megarl.config.schema import MegarlConfig
    from megarl.controller.device_map import DeviceMap
    from megarl.controller.dispatch import Dispatch, register
    from megarl.controller.worker import Worker, WorkerError
    from megarl.distributed.layout import ParallelLayout
    from megarl.errors import MegarlError
    from megarl.protocol import Batch
    from megarl.trainer.dataflow import Port, Stage
    from megarl.trainer.preference import (
        DPOTrainer,
        IPOTrainer,
        KTOTrainer,
        ORPOTrainer,
        PreferenceTrainer,
        SimPOTrainer,
    )
    from megarl.trainer.rl_trainer import RLTrainer
    from megarl.trainer.sft import SFTTrainer


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'megarl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
