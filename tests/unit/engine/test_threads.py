"""Torch threads per forward pass: one for small batches, every allowed core for large ones."""

from __future__ import annotations

import torch

from maskserve.engine import (
    PARALLEL_MIN_FLOPS,
    PARALLEL_MIN_FLOPS_PER_TOKEN,
    FillMaskEngine,
    ThreadPolicy,
    encoder_flops_per_token,
)
from maskserve.model_api import Query


def test_policy_gives_small_batches_of_a_small_model_one_thread_and_large_ones_all() -> None:
    policy = ThreadPolicy(max_threads=4, adaptive=True, flops_per_token=1e6)
    assert policy.threads_for(10) == 1
    assert policy.threads_for(int(PARALLEL_MIN_FLOPS / 1e6)) == 4


def test_policy_gives_a_wide_model_every_thread_even_for_one_short_text() -> None:
    policy = ThreadPolicy(max_threads=4, adaptive=True, flops_per_token=PARALLEL_MIN_FLOPS_PER_TOKEN)
    assert policy.threads_for(3) == 4


def test_fixed_policy_always_uses_its_threads() -> None:
    policy = ThreadPolicy(max_threads=3, adaptive=False, flops_per_token=1e6)
    assert policy.threads_for(1) == 3


def test_flops_per_token_count_weights_but_not_embeddings(bert_engine: FillMaskEngine) -> None:
    model = bert_engine.model
    embeddings = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    total = sum(p.numel() for p in model.parameters())
    assert encoder_flops_per_token(model) == 2.0 * (total - embeddings)
    assert 0 < embeddings < total


def test_engine_sets_torch_threads_for_each_batch(bert_engine: FillMaskEngine) -> None:
    before = torch.get_num_threads()
    original = bert_engine.threads
    query = Query(bert_engine.encode("the [MASK] is red."), 1)
    try:
        # A narrow model (below the per-token bar) whose batch of 64 crosses the batch bar.
        per_token = PARALLEL_MIN_FLOPS_PER_TOKEN / 2
        assert len(query.input_ids) * per_token < PARALLEL_MIN_FLOPS <= 64 * len(query.input_ids) * per_token
        bert_engine.threads = ThreadPolicy(max_threads=2, adaptive=True, flops_per_token=per_token)
        bert_engine.predict([query])
        assert torch.get_num_threads() == 1
        bert_engine.predict([query] * 64)
        assert torch.get_num_threads() == 2
    finally:
        bert_engine.threads = original
        torch.set_num_threads(before)
