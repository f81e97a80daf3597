"""The costliest request the default limits admit, against the real server on the default model.

Three of them at once, beside normal clients: each is answered within the request timeout and the
response limit, ``/livez`` stays fast and ``/readyz`` 200 throughout, normal clients get answers or
honest refusals (503, 504) and never a 500, and the server answers normally at once afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from benchmarks.costliest import Prober, costliest_body, post_json
from benchmarks.sentences import make_sentences
from maskserve.settings import Settings

from .live_server import maskserve_process

pytestmark = pytest.mark.slow

DEFAULTS = Settings()
NORMAL_CLIENTS = 8
# /livez is answered from memory: a probe slower than this means the event loop was held.
LIVEZ_P99_S = 0.1


async def normal_client(
    session: aiohttp.ClientSession, url: str, texts: list[str], stop: asyncio.Event
) -> Counter[int]:
    statuses: Counter[int] = Counter()
    index = 0
    while not stop.is_set() and index < 10_000:  # bounded: the costly requests end in seconds
        async with session.post(url, data=texts[index % len(texts)]) as response:
            body = await response.read()
            statuses[response.status] += 1
            if response.status == 200:
                assert json.loads(body)[0]["sequence"]
            elif response.status == 503:
                await asyncio.sleep(0.05)  # a client honouring Retry-After, scaled down
        index += 1
    return statuses


def check_answer(body: bytes, request: dict[str, object]) -> None:
    answer = json.loads(body)
    texts = request["inputs"]
    assert isinstance(texts, list) and len(answer) == len(texts)
    top_k = request["parameters"]["top_k"]  # type: ignore[index]
    for text, masks in zip(texts, answer):
        assert len(masks) == text.count("[MASK]") and all(len(predictions) == top_k for predictions in masks)


async def test_three_costliest_requests_at_once_are_answered_and_harm_no_one(tmp_path: Path) -> None:
    costly = costliest_body()
    with maskserve_process("--log-level", "warning", log_dir=tmp_path) as server:
        url = server.url + "/"
        texts = make_sentences(50)
        livez, readyz = Prober(server.url, "/livez").start(), Prober(server.url, "/readyz", interval_s=0.1).start()
        stop = asyncio.Event()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                normal = [asyncio.create_task(normal_client(session, url, texts, stop)) for _ in range(NORMAL_CLIENTS)]
                await asyncio.sleep(0.5)
                started = time.monotonic()
                results = await asyncio.gather(*(post_json(session, url, costly) for _ in range(3)))
                costly_s = time.monotonic() - started
                stop.set()
                statuses = sum((await asyncio.gather(*normal)), Counter())
                # Afterwards: answered at once, as before.
                after = time.monotonic()
                async with session.post(url, data="Paris is the [MASK] of France.") as response:
                    assert response.status == 200
                after_s = time.monotonic() - after
                async with session.get(server.url + "/metrics") as response:
                    metrics = await response.text()
        finally:
            livez.stop()
            readyz.stop()
    for status, body, seconds in results:
        assert status == 200, body[:500]
        assert seconds < DEFAULTS.request_timeout
        assert len(body) <= DEFAULTS.max_response_bytes
        check_answer(body, costly)
    # No pass, forward and post-processing together, held the inference thread past the timeout.
    passes = [line for line in metrics.splitlines() if line.startswith("maskserve_inference_duration_seconds_bucket")]
    within = next(line for line in passes if 'le="30.0"' in line).split()[-1]
    total = next(line for line in passes if 'le="+Inf"' in line).split()[-1]
    assert within == total, passes
    assert set(statuses) <= {200, 503, 504} and statuses[200] > 0, statuses
    assert set(livez.statuses) == {200} and set(readyz.statuses) == {200}, (
        Counter(livez.statuses),
        Counter(readyz.statuses),
    )
    assert livez.percentile(0.99) < LIVEZ_P99_S, (livez.percentile(0.99), max(livez.latencies_s), costly_s)
    assert after_s < 5.0
