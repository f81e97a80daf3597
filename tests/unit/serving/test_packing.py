from __future__ import annotations

import random

from maskserve.serving.packing import choose_batch, padded_cost, split_sorted


def test_split_separates_short_from_long_when_padding_costs_more_than_a_pass() -> None:
    runs = split_sorted([5, 5, 6, 50, 52], max_batch_size=32, max_batch_tokens=8192, batch_overhead_tokens=10)
    assert runs == [(0, 3), (3, 5)]


def test_split_keeps_one_batch_when_a_pass_costs_more_than_the_padding() -> None:
    runs = split_sorted([5, 5, 6, 50, 52], max_batch_size=32, max_batch_tokens=8192, batch_overhead_tokens=1000)
    assert runs == [(0, 5)]


def test_split_respects_size_and_token_limits_and_covers_every_text() -> None:
    rng = random.Random(7)
    for _ in range(200):
        lengths = sorted(rng.randint(3, 120) for _ in range(rng.randint(1, 70)))
        runs = split_sorted(lengths, max_batch_size=8, max_batch_tokens=400, batch_overhead_tokens=rng.choice([0, 20]))
        covered = [i for start, stop in runs for i in range(start, stop)]
        assert covered == list(range(len(lengths)))
        for start, stop in runs:
            assert stop - start <= 8
            assert stop - start == 1 or padded_cost(lengths[start:stop]) <= 400


def test_split_never_costs_more_than_fixed_size_chunks() -> None:
    rng = random.Random(3)
    for _ in range(100):
        lengths = sorted(rng.randint(3, 120) for _ in range(40))
        overhead = 16.0
        runs = split_sorted(lengths, max_batch_size=8, max_batch_tokens=10_000, batch_overhead_tokens=overhead)
        packed = sum(padded_cost(lengths[a:b]) + overhead for a, b in runs)
        chunks = sum(padded_cost(lengths[i : i + 8]) + overhead for i in range(0, 40, 8))
        assert packed <= chunks


def test_text_longer_than_the_budget_runs_alone() -> None:
    assert split_sorted([10, 600], max_batch_size=32, max_batch_tokens=100, batch_overhead_tokens=0) == [
        (0, 1),
        (1, 2),
    ]
    assert choose_batch([600], max_batch_size=32, max_batch_tokens=100, batch_overhead_tokens=0) == [0]


def test_chosen_batch_always_holds_the_oldest_text_in_arrival_order() -> None:
    rng = random.Random(11)
    for _ in range(200):
        lengths = [rng.randint(3, 120) for _ in range(rng.randint(1, 64))]
        chosen = choose_batch(lengths, max_batch_size=16, max_batch_tokens=2048, batch_overhead_tokens=24)
        assert chosen[0] == 0
        assert chosen == sorted(chosen)
        assert len(chosen) <= 16


def test_oldest_long_text_is_batched_with_its_long_peers_not_the_short_ones() -> None:
    assert choose_batch([50, 5, 6, 52, 5], max_batch_size=32, max_batch_tokens=8192, batch_overhead_tokens=10) == [
        0,
        3,
    ]
