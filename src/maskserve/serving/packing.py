"""Length-aware packing: split waiting texts into padded sub-batches of least total cost.

A padded batch costs ``texts x longest text`` tokens, so one short sentence batched with a long one
pays for the long one's padding. Sorting by token length and cutting the sorted run where padding
would cost more than an extra forward pass gives the same answers for less compute: with texts of
mixed lengths, a large share of a padded batch is padding. Free functions on plain lists, testable
without a queue.
"""

from __future__ import annotations

from collections.abc import Sequence


def padded_cost(lengths: Sequence[int]) -> int:
    """Tokens a forward pass over ``lengths`` computes, padding included."""
    return len(lengths) * max(lengths) if lengths else 0


def split_sorted(
    lengths: Sequence[int],
    *,
    max_batch_size: int,
    max_batch_tokens: int,
    batch_overhead_tokens: float,
) -> list[tuple[int, int]]:
    """Cut ascending ``lengths`` into contiguous ``(start, stop)`` runs of least total cost.

    The cost of a run is its padded tokens plus ``batch_overhead_tokens`` (the fixed cost of a
    forward pass, in token equivalents), so splitting only happens when it pays. Every run holds
    at most ``max_batch_size`` texts and ``max_batch_tokens`` padded tokens, except a single text
    longer than the budget, which runs alone. Dynamic programming, O(n x max_batch_size).
    """
    n = len(lengths)
    best = [0.0] + [float("inf")] * n  # best[j]: least cost of the first j texts
    cut = [0] * (n + 1)
    for stop in range(1, n + 1):
        longest = lengths[stop - 1]  # ascending: the run's last text is its longest
        for start in range(stop - 1, max(-1, stop - 1 - max_batch_size), -1):
            size = stop - start
            if size > 1 and size * longest > max_batch_tokens:
                break  # a longer run only adds texts: over budget too
            cost = best[start] + size * longest + batch_overhead_tokens
            if cost <= best[stop]:  # on a tie, prefer the larger run: fewer passes
                best[stop], cut[stop] = cost, start
    runs: list[tuple[int, int]] = []
    stop = n
    while stop > 0:
        runs.append((cut[stop], stop))
        stop = cut[stop]
    return runs[::-1]


def choose_batch(
    lengths: Sequence[int],
    *,
    max_batch_size: int,
    max_batch_tokens: int,
    batch_overhead_tokens: float,
) -> list[int]:
    """Indices (into ``lengths``, given oldest first) of the sub-batch to run now.

    The window is packed by length; the run holding the oldest text goes first, so no text is
    overtaken indefinitely by shorter newcomers. Indices come back in arrival order.
    """
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    runs = split_sorted(
        [lengths[i] for i in order],
        max_batch_size=max_batch_size,
        max_batch_tokens=max_batch_tokens,
        batch_overhead_tokens=batch_overhead_tokens,
    )
    oldest_rank = order.index(0)
    for start, stop in runs:
        if start <= oldest_rank < stop:
            return sorted(order[start:stop])
    raise AssertionError("the oldest text is in no run; this is a bug")
