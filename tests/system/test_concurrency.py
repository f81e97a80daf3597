"""Many simultaneous requests: each gets its own answer, and they really share forward passes."""

from __future__ import annotations

import asyncio
from typing import Any

from maskserve.engine import FillMaskEngine
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts
from tests.models import WORDS
from tests.unit.api.test_views import assert_same_answers, direct

N_REQUESTS = 60


def sentence(i: int) -> str:
    """Request i's text: from 1 to about 100 words, the mask somewhere inside, no two alike."""
    n_words = 1 + (i * 37) % 100
    words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(n_words)]
    words.insert((i * 13) % (n_words + 1), "[MASK]")
    return " ".join(words)


async def test_simultaneous_requests_each_get_their_own_answer_in_shared_batches(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model)
    texts = [sentence(i) for i in range(N_REQUESTS)]
    assert len(set(texts)) == N_REQUESTS
    lengths = [len(bert_engine.encode(t)) for t in texts]
    assert min(lengths) <= 5 and max(lengths) >= 90

    async def ask(i: int) -> tuple[int, Any, dict[str, str]]:
        if i % 2:  # half raw text with the default top_k, half JSON with their own top_k
            response = await client.post("/", data=texts[i].encode())
        else:
            response = await client.post("/", json={"inputs": texts[i], "parameters": {"top_k": 1 + i % 7}})
        return response.status, await response.json(), dict(response.headers)

    async def ask_without_mask() -> tuple[int, Any, dict[str, str]]:
        response = await client.post("/", data=b"this request has no mask at all")
        return response.status, await response.json(), dict(response.headers)

    bad = asyncio.ensure_future(ask_without_mask())
    results = await asyncio.gather(*(ask(i) for i in range(N_REQUESTS)), bad)

    bad_status, bad_body, _ = results[-1]
    assert bad_status == 422 and bad_body["error_type"] == "no_mask_token"
    for i, (status, body, _) in enumerate(results[:-1]):
        assert status == 200, (i, body)
        top_k = 5 if i % 2 else 1 + i % 7
        assert_same_answers(body, direct(bert_engine, texts[i], top_k)[0])

    batcher = default_parts(client).batcher
    assert sum(model.batch_sizes()) >= N_REQUESTS  # a split retry would only add to it
    assert max(model.batch_sizes()) > 1, model.batch_sizes
    assert batcher.scheduler.batches_run < N_REQUESTS
    assert any(int(headers["X-Batch-Size"]) > 1 for _, _, headers in results[:-1])
