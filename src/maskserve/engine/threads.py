"""How many torch threads a forward pass gets: every allowed core, or one for a small model's small batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

# A small model's forward pass below PARALLEL_MIN_FLOPS runs on one thread; anything bigger, and
# every pass of a model of at least PARALLEL_MIN_FLOPS_PER_TOKEN, on every allowed core. Narrow
# layers gain nothing from splitting their small matrices, and torch's threads spin waiting for a
# core whenever the event loop, a client or another process holds one, so a small model's small
# batch runs several times slower on two threads than on one as soon as anything else runs. Wide
# layers (bert-base's 768) split well even for one short text. The benchmark's thread runs
# (``python -m benchmarks.run``, "Backends, int8 and bf16") measure both sides of these bounds.
PARALLEL_MIN_FLOPS = 2e9
PARALLEL_MIN_FLOPS_PER_TOKEN = 2e7


@dataclass(frozen=True)
class ThreadPolicy:
    """How many torch threads a forward pass gets: fixed, or by the work in the batch."""

    max_threads: int
    adaptive: bool
    flops_per_token: float

    def threads_for(self, padded_tokens: int) -> int:
        if (
            not self.adaptive
            or self.flops_per_token >= PARALLEL_MIN_FLOPS_PER_TOKEN
            or padded_tokens * self.flops_per_token >= PARALLEL_MIN_FLOPS
        ):
            return self.max_threads
        return 1


def encoder_flops_per_token(model: PreTrainedModel) -> float:
    """About 2 FLOPs per weight per token, embeddings excluded (they are lookups, not products)."""
    embedding_weights = sum(
        p.numel() for module in model.modules() if isinstance(module, torch.nn.Embedding) for p in module.parameters()
    )
    return 2.0 * max(0, sum(p.numel() for p in model.parameters()) - embedding_weights)
