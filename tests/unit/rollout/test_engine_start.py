"""What an engine start no longer pays: the sampled token's rank counted without a compile at small
sizes (the same integers as a sort-based count), and the heap collected, then frozen as vLLM's own start
leaves it."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch._dynamo.utils import counters

from megarl.rollout.engine_start import EAGER_MAX, frozen_heap, ranks_compiled_when_large

pytestmark = pytest.mark.unit


def sorted_rank(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How many entries of each row are ≥ its value, from the row sorted in descending order."""
    ordered = x.sort(dim=-1, descending=True).values
    return torch.searchsorted(-ordered, -values, right=True).squeeze(-1)


@pytest.mark.parametrize("rows, vocab", [(1, 1001), (64, 1001), (256, 4000)])
def test_small_rank_counts_are_exact_and_compile_nothing(rows, vocab):
    import vllm.v1.sample.sampler as sampler

    assert rows * vocab < EAGER_MAX
    ranks_compiled_when_large()
    ranks_compiled_when_large()  # idempotent: one wrapper, not a wrapper of a wrapper
    count = sampler.batched_count_greater_than
    assert count.megarl_eager_below == EAGER_MAX
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, vocab, generator=g).log_softmax(-1)
    values = x.gather(-1, torch.randint(vocab, (rows, 1), generator=g))
    frames = sum(counters["frames"].values())
    ranks = count(x, values)
    assert sum(counters["frames"].values()) == frames, "a small count went through Dynamo"
    assert ranks.tolist() == sorted_rank(x, values).tolist()
    assert ranks.min() >= 1  # the sampled token counts itself


class Node:
    pass


def test_the_heap_is_collected_then_frozen():
    gc.unfreeze()
    kept = [[i] for i in range(1000)]
    cycle = Node()
    cycle.self = cycle  # garbage only a collection frees
    dead = weakref.ref(cycle)
    del cycle
    frozen_heap()
    try:
        assert dead() is None, "the garbage was frozen instead of collected"
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
