"""Fixtures of the model unit tests."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world_of_one():
    """A gloo world of one process (megarl's CPU shims applied), for megatron code that needs a group;
    left as found when a world already exists."""
    from megarl.distributed.cpu_shims import apply_cpu_shims

    apply_cpu_shims()
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()
