"""Token balancing: partitions against brute-force optima, micro-batch budgets, min_count, errors, determinism."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from megarl.data.batching import (
    balanced_partition,
    dp_balance_order,
    imbalance,
    micro_batches_by_count,
    micro_batches_by_tokens,
)

pytestmark = pytest.mark.unit


def part_sums(lengths: list[int], parts: list[list[int]]) -> list[int]:
    return [sum(lengths[i] for i in part) for part in parts]


def assert_partition(parts: list[list[int]], n: int) -> None:
    for part in parts:
        assert part == sorted(part)
    assert sorted(i for part in parts for i in part) == list(range(n))


def brute_force_best_max(lengths: list[int], k: int, equal_size: bool) -> int:
    """Smallest achievable largest part sum over every assignment of items to k parts."""
    n = len(lengths)
    rest = np.array(list(itertools.product(range(k), repeat=n - 1)), dtype=np.int64).reshape(
        k ** (n - 1), n - 1
    )
    assign = np.concatenate([np.zeros((len(rest), 1), dtype=np.int64), rest], axis=1)  # item 0 in part 0
    onehot = assign[:, :, None] == np.arange(k)
    sums = (onehot * np.array(lengths)[None, :, None]).sum(axis=1)
    if equal_size:
        sums = sums[(onehot.sum(axis=1) == n // k).all(axis=1)]
    return int(sums.max(axis=1).min())


def brute_force_min_bins(lengths: list[int], capacity: int) -> int:
    """Fewest bins of `capacity` that hold all items, by dynamic programming over subsets."""
    n = len(lengths)
    fits = [sum(lengths[i] for i in range(n) if mask >> i & 1) <= capacity for mask in range(1 << n)]
    best = [0] + [n + 1] * ((1 << n) - 1)
    for mask in range(1, 1 << n):
        low = mask & -mask
        rest = sub = mask ^ low
        while True:
            if fits[sub | low]:
                best[mask] = min(best[mask], best[mask ^ (sub | low)] + 1)
            if sub == 0:
                break
            sub = (sub - 1) & rest
    return best[-1]


def small_instances(seed: int, count: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    # Hand-picked instances where differencing misses the optimum (7/6 is its tight two-way ratio).
    cases = [([2, 2, 2, 3, 3], 2), ([8, 7, 6, 5, 4], 2), ([1, 1, 10, 3, 6, 3], 2), ([5, 5, 4, 4, 3, 3, 3], 3)]
    for _ in range(count):
        n, k = rng.randint(1, 8), rng.choice([2, 3, 4])
        high = rng.choice([10, 1000])
        cases.append(([rng.randint(1, high) for _ in range(n)], k))
    return cases


def test_partition_within_differencing_bound_of_brute_force_optimum():
    for lengths, k in small_instances(seed=0, count=120):
        parts = balanced_partition(lengths, k)
        assert len(parts) == k
        assert_partition(parts, len(lengths))
        got, best = max(part_sums(lengths, parts)), brute_force_best_max(lengths, k, equal_size=False)
        # Michiels et al. 2007: the k-way differencing method is within 4/3 - 1/(3k) of the optimum.
        assert got <= (4 / 3 - 1 / (3 * k)) * best + 1e-9, (lengths, k, parts)
        if k == 2 and len(lengths) <= 4:
            assert got == best, (lengths, parts)  # two-way differencing is exact up to 4 items


def test_equal_size_partition_within_bound_and_sizes_equal():
    for lengths, k in small_instances(seed=1, count=150):
        if len(lengths) % k:
            continue
        parts = balanced_partition(lengths, k, equal_size=True)
        assert [len(part) for part in parts] == [len(lengths) // k] * k
        assert_partition(parts, len(lengths))
        got, best = max(part_sums(lengths, parts)), brute_force_best_max(lengths, k, equal_size=True)
        # Michiels et al. 2003: with equal cardinalities the differencing method is within 2 - 1/k.
        assert got <= (2 - 1 / k) * best + 1e-9, (lengths, k, parts)


def test_partition_of_typical_response_lengths_is_nearly_perfect():
    rng = random.Random(7)
    lengths = [rng.randint(16, 2048) for _ in range(512)]
    for equal_size in (False, True):
        parts = balanced_partition(lengths, 8, equal_size=equal_size)
        assert_partition(parts, len(lengths))
        assert imbalance(lengths, parts) < 1.001
    contiguous = [list(range(r * 64, (r + 1) * 64)) for r in range(8)]
    assert imbalance(lengths, contiguous) > 1.02  # what balancing is for


def test_partition_is_a_partition_for_random_inputs():
    rng = random.Random(3)
    for _ in range(200):
        n, k = rng.randint(0, 40), rng.randint(1, 9)
        lengths = [rng.choice([0, rng.randint(1, 50), rng.randint(1, 5000)]) for _ in range(n)]
        parts = balanced_partition(lengths, k)
        assert len(parts) == k
        assert_partition(parts, n)
        if all(lengths) and n >= k:
            assert all(parts)
        if n % k == 0:
            eq = balanced_partition(lengths, k, equal_size=True)
            assert_partition(eq, n)
            assert {len(part) for part in eq} == {n // k}


def test_partition_is_deterministic_and_ordered_by_first_index():
    lengths = [5, 5, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1]
    first = balanced_partition(lengths, 4, equal_size=True)
    assert all(balanced_partition(list(lengths), 4, equal_size=True) == first for _ in range(5))
    assert [part[0] for part in first] == sorted(part[0] for part in first)
    assert part_sums(lengths, first) == [9, 9, 9, 9]
    assert balanced_partition([4, 1], 4) == [[0], [1], [], []]


def test_partition_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"7 items cannot form 2 parts of equal size"):
        balanced_partition([1] * 7, 2, equal_size=True)
    with pytest.raises(ValueError, match="k=0"):
        balanced_partition([1, 2], 0)
    with pytest.raises(ValueError, match="length 1 is -3"):
        balanced_partition([1, -3], 2)


def test_dp_balance_order_gives_balanced_contiguous_chunks():
    rng = random.Random(11)
    lengths = [rng.randint(1, 4096) for _ in range(64)]
    order = dp_balance_order(lengths, 4)
    assert sorted(order) == list(range(64))
    chunks = [order[r * 16 : (r + 1) * 16] for r in range(4)]
    assert imbalance(lengths, chunks) < 1.01
    assert [sorted(c) for c in chunks] == balanced_partition(lengths, 4, equal_size=True)


def test_micro_batches_by_count_are_consecutive():
    assert micro_batches_by_count(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert micro_batches_by_count(4, 4) == [[0, 1, 2, 3]]
    assert micro_batches_by_count(0, 2) == []
    with pytest.raises(ValueError, match="micro_batch_size must be positive"):
        micro_batches_by_count(4, 0)


def test_micro_batches_by_tokens_respect_budget_on_random_inputs():
    rng = random.Random(5)
    for _ in range(150):
        n = rng.randint(1, 200)
        lengths = [rng.randint(1, 1024) for _ in range(n)]
        max_tokens = rng.randint(max(lengths), 8 * 1024)
        parts = micro_batches_by_tokens(lengths, max_tokens)
        assert_partition(parts, n)
        assert all(parts)
        assert max(part_sums(lengths, parts)) <= max_tokens
        assert len(parts) >= math.ceil(sum(lengths) / max_tokens)


def test_micro_batch_count_matches_brute_force_fewest_bins():
    rng = random.Random(9)
    extra = []
    for _ in range(300):
        lengths = [rng.randint(1, 100) for _ in range(rng.randint(1, 8))]
        max_tokens = rng.randint(max(lengths), sum(lengths) + 1)
        extra.append(
            len(micro_batches_by_tokens(lengths, max_tokens)) - brute_force_min_bins(lengths, max_tokens)
        )
    # Not bin packing: balancing first may cost a bin; measured on these seeds it does in 2 cases of 300.
    assert min(extra) == 0 and max(extra) <= 1
    assert sum(extra) <= 3


def test_micro_batches_by_tokens_are_balanced():
    rng = random.Random(13)
    lengths = [rng.randint(32, 4096) for _ in range(256)]
    parts = micro_batches_by_tokens(lengths, 16384)
    assert len(parts) == math.ceil(sum(lengths) / 16384)
    assert imbalance(lengths, parts) < 1.02


def test_min_count_lets_dp_ranks_agree_on_the_count():
    rng = random.Random(17)
    per_rank = [[rng.randint(1, 3000) for _ in range(32)] for _ in range(4)]
    own = [len(micro_batches_by_tokens(lengths, 8192)) for lengths in per_rank]
    agreed = max(own)  # what the worker's all-reduce(MAX) over the DP group returns
    assert min(own) < agreed
    for lengths in per_rank:
        parts = micro_batches_by_tokens(lengths, 8192, min_count=agreed)
        assert len(parts) == agreed
        assert_partition(parts, len(lengths))
        assert all(parts) and max(part_sums(lengths, parts)) <= 8192
    assert len(micro_batches_by_tokens([5, 3, 2], 100, min_count=3)) == 3
    with pytest.raises(ValueError, match="min_count=4 micro-batches cannot be formed from 3 sequences"):
        micro_batches_by_tokens([5, 3, 2], 100, min_count=4)


def test_oversize_sequence_error_names_length_and_budget():
    with pytest.raises(ValueError) as err:
        micro_batches_by_tokens([100, 5000, 20], 4096)
    message = str(err.value)
    assert "sequence 1 has 5000 tokens" in message
    assert "4096" in message
    assert "raise max_tokens_per_micro_batch" in message


def test_micro_batches_by_tokens_edge_cases():
    assert micro_batches_by_tokens([], 10) == []
    assert micro_batches_by_tokens([0, 0, 0], 10) == [[0, 1, 2]]
    assert micro_batches_by_tokens([10, 10, 10], 10) == [[0], [1], [2]]
    lengths = list(range(1, 30))
    assert micro_batches_by_tokens(lengths, 100) == micro_batches_by_tokens(list(lengths), 100)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        micro_batches_by_tokens([1], 0)


def test_imbalance_is_max_over_mean():
    lengths = [4, 2, 2, 0]
    assert imbalance(lengths, [[0], [1, 2], [3]]) == pytest.approx(4 / (8 / 3), abs=1e-12)
    assert imbalance(lengths, [[0], [1, 2]]) == 1.0
    assert imbalance([0, 0], [[0], [1]]) == 1.0
