"""The offline limit: the same sentences through transformers' pipeline in-process, no server.

Also the reference answers the load generator checks every reply against.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from transformers import pipeline

from .load import Expected


def load_pipeline(model: str) -> Any:
    return pipeline(task="fill-mask", model=model)


def _one(result: Any) -> list[dict[str, Any]]:
    # The pipeline unwraps a single mask's list of lists; one mask per sentence here.
    if result and isinstance(result[0], list):
        raise ValueError("one mask per sentence is expected")
    return list(result)


def reference_answers(pipe: Any, sentences: Sequence[str], *, top_k: int = 5) -> tuple[list[Expected], list[float]]:
    """For each sentence, one unbatched pipeline call: its top answers and its latency in ms.

    The latencies are "one offline pipeline call" that maskserve's concurrency-1 p50 is held to.
    """
    expected: list[Expected] = []
    latencies_ms: list[float] = []
    for sentence in sentences:
        started = time.perf_counter()
        predictions = _one(pipe(sentence, top_k=top_k))
        latencies_ms.append((time.perf_counter() - started) * 1000)
        expected.append({p["token"]: p["sequence"] for p in predictions})
    return expected, latencies_ms


def by_length(pipe: Any, sentences: Sequence[str]) -> list[str]:
    """The sentences ordered by token count, so each batch pads little."""
    lengths = [len(ids) for ids in pipe.tokenizer(list(sentences))["input_ids"]]
    return [s for _, s in sorted(zip(lengths, sentences), key=lambda pair: pair[0])]


def offline_rate(pipe: Any, sentences: Sequence[str], *, batch_size: int) -> float:
    """Sentences per second of one pipeline pass over ``sentences`` in the given order."""
    started = time.perf_counter()
    results = pipe(list(sentences), batch_size=batch_size)
    elapsed = time.perf_counter() - started
    if len(results) != len(sentences):  # this is a bug in the pipeline or in how it is called
        raise RuntimeError(f"{len(results)} answers for {len(sentences)} sentences")
    return len(sentences) / elapsed
