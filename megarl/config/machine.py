"""How many ranks this machine can hold, checked at load time for runs that start all their ranks here.

A single-node run (`trainer.nnodes=1`) under torchrun, or under Ray with a private cluster (no
`RAY_ADDRESS`), places its `trainer.n_devices_per_node` ranks on this machine:

- with GPUs, one rank per GPU: at most `torch.cuda.device_count()` (CUDA_VISIBLE_DEVICES applies);
- without, ranks are CPU process slots: the private Ray cluster offers `local_ray_cpus()` CPUs of which
  each rank reserves `CPUS_PER_RANK` (bookkeeping, not cores: 2 ranks per core, at least 16 ranks); a
  torchrun run is held to the same number.

A multi-node run, or one on a cluster named by `RAY_ADDRESS`, is checked when its pools are placed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from megarl.config.schema import MegarlConfig

__all__ = ["CPUS_PER_RANK", "Machine", "check_machine", "local_ray_cpus"]

_GPU_DRIVER_DEVICES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's, ROCm's
CPUS_PER_RANK = 0.5  # the CPUs one rank's Ray bundle reserves (megarl.controller.resource_pool.ResourcePool)


def local_ray_cpus(cores: int | None = None) -> int:
    """The CPUs a private Ray cluster on this machine declares (start_local_ray's default num_cpus)."""
    return max(8, cores if cores is not None else os.cpu_count() or 1)


@dataclass(frozen=True)
class Machine:
    gpus: int
    cores: int

    @staticmethod
    def here() -> Machine:
        return Machine(gpus=_gpus(), cores=os.cpu_count() or 1)

    @property
    def max_ranks(self) -> int:
        return self.gpus or int(local_ray_cpus(self.cores) / CPUS_PER_RANK)

    def describe(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPU" + ("s" if self.gpus != 1 else "")
        return (
            f"no GPU and {self.cores} CPU core{'s' if self.cores != 1 else ''}, so at most {self.max_ranks} CPU "
            f"processes (2 per core, at least 16)"
        )


def _gpus() -> int:
    """torch's count of this machine's GPUs; 0 without a GPU driver, without importing torch (3 s)."""
    if not any(os.path.exists(device) for device in _GPU_DRIVER_DEVICES):
        return 0
    import torch

    return torch.cuda.device_count()


def runs_here(cfg: MegarlConfig) -> bool:
    """Whether every rank of `cfg`'s run starts on this machine."""
    if cfg.trainer.nnodes != 1:
        return False
    return cfg.trainer.launcher == "torchrun" or os.environ.get("RAY_ADDRESS", "").strip() in ("", "local")


def check_machine(cfg: MegarlConfig, problems: list[str], machine: Machine | None = None) -> None:
    """Append a problem when a run that starts here asks for more ranks than this machine holds."""
    n = cfg.trainer.n_devices_per_node
    if n < 1 or not runs_here(cfg):
        return
    machine = machine or Machine.here()
    if n <= machine.max_ranks:
        return
    problems.append(
        f"trainer.n_devices_per_node={n} asks for {n} ranks on this machine, which has {machine.describe()}; "
        f"set trainer.n_devices_per_node={machine.max_ranks} or less (and the roles' n_devices and devices "
        "within it), or run on a cluster (trainer.nnodes > 1, or a Ray cluster named by RAY_ADDRESS)"
    )
