"""Splitting sequences into token-balanced parts: DP ranks from a batch, micro-batches from a rank's share.

Pure functions of sequence lengths (token counts); no torch, no process groups. The driver balances a batch
over data-parallel ranks with `dp_balance_order`; each worker cuts its share into micro-batches with
`micro_batches_by_count` or `micro_batches_by_tokens`. `imbalance` turns any split into a metric.

Balancing uses the Karmarkar-Karp largest differencing method generalised to k parts: every item starts as
a k-part partial solution, and the two partial solutions whose largest and smallest part differ the most are
merged by pairing the largest part of one with the smallest part of the other, until one remains. Its
largest part is at most (4/3 - 1/(3k)) times the optimum; with equal part sizes, at most (2 - 1/k) times.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

# A partial solution: its non-empty parts as (token sum, item indices), largest sum first; up to k parts.
_Parts = list[tuple[int, list[int]]]


def balanced_partition(lengths: Sequence[int], k: int, equal_size: bool = False) -> list[list[int]]:
    """Item indices split into `k` parts whose summed lengths are as equal as the method can make them.

    With `equal_size=True` every part holds exactly len(lengths) / k items (which must divide evenly).
    Each part's indices are ascending; parts are ordered by their first index, empty parts last (a part
    can only be empty when there are fewer items than parts, or zero lengths). Deterministic.
    """
    lengths = _as_lengths(lengths)
    if k <= 0:
        raise ValueError(f"number of parts must be positive, got k={k}")
    n = len(lengths)
    if equal_size and n % k:
        raise ValueError(
            f"equal_size=True needs the item count to be divisible by k: {n} items cannot form {k} parts "
            f"of equal size; pad the batch to a multiple of {k} or use equal_size=False"
        )

    # Heaviest items first so the initial partial solutions with the largest spread are merged first.
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    if equal_size:
        # One item per part in every partial solution keeps all part sizes equal through each merge.
        starts = [order[g : g + k] for g in range(0, n, k)]
    else:
        starts = [[i] for i in order]

    heap = [(-_spread(parts, k), tick, parts) for tick, parts in enumerate(_starts(lengths, starts))]
    heapq.heapify(heap)
    tick = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = _merge(a, b, k)
        heapq.heappush(heap, (-_spread(merged, k), tick, merged))
        tick += 1

    result = [sorted(items) for _, items in heap[0][2]] if heap else []
    result += [[] for _ in range(k - len(result))]
    result.sort(key=lambda part: (not part, part[0] if part else 0))
    return result


def dp_balance_order(lengths: Sequence[int], dp_size: int) -> list[int]:
    """A permutation of the batch rows such that its contiguous split into `dp_size` equal chunks is
    token-balanced: reorder the batch with it (`batch.reorder(order)`) before dispatching, and rank r
    receives the r-th balanced part. Needs len(lengths) divisible by dp_size."""
    return [i for part in balanced_partition(lengths, dp_size, equal_size=True) for i in part]


def balance_for_dp(batch, dp_size: int):
    """`batch` reordered so every data-parallel rank gets about the same number of real tokens
    (attention_mask row sums); returns (reordered batch, order) — `order[i]` is the original row of
    row i, so per-row results map back with `out[order] = result`."""
    order = dp_balance_order(batch["attention_mask"].sum(-1).tolist(), dp_size)
    return batch.reorder(order), order


def micro_batches_by_count(n: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive micro-batches of `micro_batch_size` row indices over `n` rows; the last may be shorter."""
    if n < 0:
        raise ValueError(f"row count must be non-negative, got {n}")
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
    return [list(range(s, min(s + micro_batch_size, n))) for s in range(0, n, micro_batch_size)]


def micro_batches_by_tokens(
    lengths: Sequence[int], max_tokens: int, min_count: int | None = None
) -> list[list[int]]:
    """The fewest balanced micro-batches this method finds whose token sums each stay within `max_tokens`.

    Starts from the lower bound ceil(sum / max_tokens) (or `min_count` if larger) and adds one micro-batch
    at a time until a balanced partition fits the budget; every micro-batch holds at least one sequence.

    `min_count` is a floor for callers that need a given count. The workers pass none: DP ranks may run
    different counts, since each runs its own pipeline schedule and gradients are reduced once per step.
    """
    lengths = _as_lengths(lengths)
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    n = len(lengths)
    longest = max(range(n), key=lambda i: lengths[i], default=None)
    if longest is not None and lengths[longest] > max_tokens:
        raise ValueError(
            f"sequence {longest} has {lengths[longest]} tokens, more than the micro-batch budget of "
            f"{max_tokens} tokens; raise max_tokens_per_micro_batch to at least {lengths[longest]}"
        )
    if n == 0 and not min_count:
        return []
    count = max(math.ceil(sum(lengths) / max_tokens), min_count or 1)
    if count > n:
        raise ValueError(
            f"min_count={min_count} micro-batches cannot be formed from {n} sequences (each micro-batch "
            "needs at least one); give every data-parallel rank the same number of rows"
        )
    # Zero-length rows weigh 1 so that no micro-batch comes out empty; the budget uses true lengths.
    weights = [max(length, 1) for length in lengths]
    while True:
        parts = balanced_partition(weights, count)
        if all(sum(lengths[i] for i in part) <= max_tokens for part in parts):
            return parts
        count += 1


def imbalance(lengths: Sequence[int], parts: Sequence[Sequence[int]]) -> float:
    """Largest part's tokens over the mean part's tokens: 1.0 is perfectly balanced, k is all in one of k."""
    lengths = _as_lengths(lengths)
    if not parts:
        raise ValueError("imbalance needs at least one part")
    sums = [sum(lengths[i] for i in part) for part in parts]
    total = sum(sums)
    return max(sums) * len(sums) / total if total else 1.0


def _starts(lengths: list[int], starts: list[list[int]]) -> list[_Parts]:
    return [sorted(((lengths[i], [i]) for i in items), key=lambda part: -part[0]) for items in starts]


def _spread(parts: _Parts, k: int) -> int:
    return parts[0][0] - (parts[-1][0] if len(parts) == k else 0)


def _merge(a: _Parts, b: _Parts, k: int) -> _Parts:
    """Pairs a's largest part with b's smallest and so on, so the two spreads cancel as far as possible.

    Both hold only their non-empty parts (largest first); the remaining parts up to k are implied empty.
    Part i of a meets part k-1-i of b, which is a real part only from i = k - len(b) on.
    """
    merged = []
    first_b = k - len(b)
    for i in [*range(min(len(a), first_b)), *range(first_b, k)]:
        sum_a, items_a = a[i] if i < len(a) else (0, [])
        sum_b, items_b = b[k - 1 - i] if i >= first_b else (0, [])
        # Extending the longer list keeps the total copying at O(n log n).
        big, small = (items_a, items_b) if len(items_a) >= len(items_b) else (items_b, items_a)
        big.extend(small)
        merged.append((sum_a + sum_b, big))
    merged.sort(key=lambda part: -part[0])
    return merged


def _as_lengths(lengths: Sequence[int]) -> list[int]:
    values = [int(x) for x in lengths]
    negative = next((i for i, x in enumerate(values) if x < 0), None)
    if negative is not None:
        raise ValueError(f"sequence lengths must be non-negative; length {negative} is {values[negative]}")
    return values
