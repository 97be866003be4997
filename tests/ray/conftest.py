"""Resource pools on the session's Ray cluster (`ray_cluster`, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def _pool(ranks: int) -> Iterator:
    from megarl.controller.resource_pool import ResourcePool

    pool = ResourcePool([ranks], use_gpu=False, name=f"test-pool{ranks}")
    yield pool
    pool.remove()


@pytest.fixture(scope="module")
def pool4(ray_cluster) -> Iterator:
    """Four CPU ranks on this node, shared by the module's worker groups (side by side or one by one)."""
    yield from _pool(4)


@pytest.fixture(scope="module")
def pool2(ray_cluster) -> Iterator:
    """Two CPU ranks: each worker process imports torch and megatron (~7 s of CPU), so tests that
    only need "some peers" use two."""
    yield from _pool(2)
