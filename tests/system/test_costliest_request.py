"""The costliest requests the default limits admit, against the real server: on the default
model, and on a random model of bert-base's shape.

Short texts, every limit at its maximum: three of them at once, beside normal clients: each is
answered within the request timeout and the response limit, ``/livez`` stays fast and ``/readyz``
200 throughout, normal clients get answers or honest refusals (503, 504) and never a 500, and the
server answers normally at once afterwards.

Long texts and scoring: past the model's length the limits no longer bound a request's cost, the
measured cost does (a request that could not end within the request timeout is refused, 422
``request_too_costly``, before any work). So each test sends the costliest request of its family
that the server admits, found on the server's own answers to the request sent with a 1 s deadline
(``benchmarks.costliest.costliest_admitted``, no forward pass spent; ``send_costliest`` sends it
with the whole deadline): texts of ``--max-text-tokens`` with the most masks, or one text scored
token by token. Each ends within the request timeout (+ 3 s of the client's own clock) with every
``/livez`` probe fast. On the default model the scoring request also runs beside fill-mask clients,
which are answered 200 or refused (503 with Retry-After), never failed or left to time out, and
back to back from three clients. On bert-base's shape the long-text request admitted is longer
than the model reads; a text scored past what the server admits (on a small CPU, any text longer
than the model reads) is refused 422 at once, naming its cost.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from benchmarks.costliest import (
    MODEL_TOKENS,
    Admitted,
    Prober,
    Sent,
    costliest_admitted,
    costliest_body,
    costliest_score_body,
    long_text_windows,
    post_json,
    send_costliest,
)
from benchmarks.models import build_random_model
from benchmarks.sentences import make_sentences
from maskserve.config.settings import Settings
from tests.live_server import ServerProcess, maskserve_process

# serial: these tests bound times, which a neighbour on the same cores would stretch.
pytestmark = [pytest.mark.slow, pytest.mark.load, pytest.mark.serial]

DEFAULTS = Settings()
NORMAL_CLIENTS = 8
# /livez is answered from memory: a probe slower than this (beyond the idle server's own, see
# idle_livez_s) means the event loop was held.
LIVEZ_P99_S = 0.1
# The long requests' bounds ("ends within the request timeout + 3 s while /livez stays under
# 250 ms"): every probe, not a percentile, and the client's whole wait, answer read.
LIVEZ_MAX_S = 0.25
SCORE_SLACK_S = 3.0
# How long the scoring request may take to show up in the queue: tokenizing one long text.
QUEUED_WITHIN_S = 10.0
# How long scoring clients send the costliest request back to back, and how many of them: as many
# as the fill-mask test sends at once. Bounded: one admitted request takes up to the request
# timeout, and the others are refused at once while it runs.
SUSTAIN_S = 6.0
SCORING_CLIENTS = 3
# A refused scoring client comes back after Retry-After divided by this: the work ahead is one
# request of about the whole timeout, so it comes back a few times within SUSTAIN_S.
RETRY_AFTER_SCALE = 10.0
# The client's patience: the request timeout, its slack, and reading the answer, with room.
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=120)
# How long a shared server may take to end a previous test's work: one pass, far less than this.
IDLE_WITHIN_S = 60.0
# A request refused for its cost is refused before any work: after its parse, in seconds at most.
REFUSED_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def bert_base_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``python -m maskserve`` on a random model of bert-base's shape, shared by the tests on it
    (building and warming the model up is most of their time). The model is built into this run's
    own folder, not the benchmarks' cache, which another pytest process may be writing, and
    removed afterwards (440 MB)."""
    folder = tmp_path_factory.mktemp("bert-base")
    model = build_random_model(folder / "model")
    try:
        with maskserve_process("--model", str(model), "--log-level", "warning", log_dir=folder) as server:
            yield server
    finally:
        shutil.rmtree(model, ignore_errors=True)


async def wait_until_idle(session: aiohttp.ClientSession, base: str) -> None:
    """Until no text is queued and no pass runs (bounded): on the shared server, the last pass of
    a previous test's request may still run, and its measure still move the predicted costs."""
    ends = time.monotonic() + IDLE_WITHIN_S
    while time.monotonic() < ends:
        async with session.get(base + "/livez") as live, session.get(base + "/readyz") as ready:
            if not (await live.json())["busy"] and (await ready.json())["queue_depth"] == 0:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server at {base} was still busy after {IDLE_WITHIN_S:g}s")


async def find_costliest(base: str, family: str) -> Admitted:
    """The costliest request of ``family`` (long texts or scoring) the server at ``base`` admits
    once idle, found at no model work; a failure naming the family when it admits none."""
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        await wait_until_idle(session, base)
        found = await costliest_admitted(session, base, family)
    assert found.body is not None, (
        f"the server admits no request of the {family!r} family, not even its smallest: its measured "
        "cost is beyond the request timeout"
    )
    return found


async def idle_livez_s(base: str) -> float:
    """The slowest ``/livez`` of the idle server over a second: this machine's own delay, which the
    bounds add to. A busy machine (another job on a core) delays every answer, its loop held or not;
    a loop held by the costly work shows on top of it."""
    idle = Prober(base, "/livez").start()
    await asyncio.sleep(1.0)
    idle.stop()
    return max(idle.latencies_s)


async def normal_client(
    session: aiohttp.ClientSession, url: str, texts: list[str], stop: asyncio.Event
) -> Counter[int]:
    statuses: Counter[int] = Counter()
    index = 0
    while not stop.is_set() and index < 10_000:  # bounded: the costly requests end within the timeout
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
        idle_s = await idle_livez_s(server.url)
        livez, readyz = Prober(server.url, "/livez").start(), Prober(server.url, "/readyz", interval_s=0.1).start()
        stop = asyncio.Event()
        try:
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
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
    # Each is answered in full within its deadline. On a busy machine the third may not fit behind
    # the other two: then it is refused at the door with Retry-After (503) or runs out of time
    # (504), load's honest answers; at least one is always answered.
    assert any(status == 200 for status, _, _ in results), [(status, body[:200]) for status, body, _ in results]
    for status, body, seconds in results:
        if status != 200:
            assert (status, json.loads(body)["error_type"]) in {(503, "overloaded"), (504, "timeout")}, body[:500]
            continue
        # The server's deadline holds; the client's clock also counts reading 2 MB.
        assert seconds < DEFAULTS.request_timeout + SCORE_SLACK_S
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
    p99 = livez.percentile(0.99)
    assert p99 < LIVEZ_P99_S + idle_s, (p99, max(livez.latencies_s), idle_s, costly_s)
    assert after_s < 5.0


async def wait_until_queued(session: aiohttp.ClientSession, base: str, costly: asyncio.Task[object]) -> bool:
    """Until ``/readyz`` shows texts queued (the costly request admitted), or it ended; bounded."""
    ends = time.monotonic() + QUEUED_WITHIN_S
    while time.monotonic() < ends and not costly.done():
        async with session.get(base + "/readyz") as response:
            if (await response.json())["queue_depth"] > 0:
                return True
        await asyncio.sleep(0.01)
    return False


def check_scores(body: bytes, found: Admitted) -> None:
    """The answer scores every token of the one text sent."""
    assert [len(text["tokens"]) for text in json.loads(body)] == [found.size]


async def test_costliest_scoring_request_ends_in_time_while_fill_mask_clients_are_answered(tmp_path: Path) -> None:
    with maskserve_process("--log-level", "warning", log_dir=tmp_path) as server:
        found = await find_costliest(server.url, "score")
        fill_mask_url = server.url + "/"
        sentences = make_sentences(50)
        idle_s = await idle_livez_s(server.url)
        livez, readyz = Prober(server.url, "/livez").start(), Prober(server.url, "/readyz", interval_s=0.1).start()
        stop = asyncio.Event()
        try:
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
                # Sent to an idle queue, as admitted; the fill-mask clients start once it is in.
                scoring = asyncio.create_task(send_costliest(session, server.url, "score", found))
                queued = await wait_until_queued(session, server.url, scoring)
                normal = [
                    asyncio.create_task(normal_client(session, fill_mask_url, sentences, stop))
                    for _ in range(NORMAL_CLIENTS)
                ]
                sent = await scoring
                stop.set()
                statuses = sum((await asyncio.gather(*normal)), Counter())
        finally:
            livez.stop()
            readyz.stop()
    print(
        f"figures: the costliest /score admitted, {sent.admitted.size} tokens (found {found.size}): "
        f"{sent.seconds:.1f}s; /livez max {max(livez.latencies_s) * 1000:.0f} ms (idle {idle_s * 1000:.0f} ms); "
        f"fill-mask clients {dict(statuses)}"
    )
    assert queued, "the scoring request never showed up in the queue"
    check_in_time_with_livez_fast(sent, idle_s, livez)
    check_scores(sent.body, sent.admitted)
    # Every fill-mask client was answered while it ran, or refused (503, Retry-After) while the
    # work ahead of its text would outlast its deadline.
    assert set(statuses) <= {200, 503} and statuses[200] > 0, statuses
    assert set(readyz.statuses) == {200}, Counter(readyz.statuses)


async def costliest_alone(base: str, family: str) -> tuple[Sent, float, Prober]:
    """The costliest request of ``family`` the idle server at ``base`` admits, sent alone while
    /livez is probed: its answer, the idle server's own /livez delay, and the probe."""
    found = await find_costliest(base, family)
    idle_s = await idle_livez_s(base)
    livez = Prober(base, "/livez").start()
    try:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            sent = await send_costliest(session, base, family, found)
    finally:
        livez.stop()
    return sent, idle_s, livez


def check_in_time_with_livez_fast(sent: Sent, idle_s: float, livez: Prober) -> None:
    """Answered within the request timeout (+ the client's slack), every /livez probe fast."""
    assert sent.status == 200, sent.body[:500]
    assert sent.seconds < DEFAULTS.request_timeout + SCORE_SLACK_S
    assert set(livez.statuses) == {200}
    assert max(livez.latencies_s) < LIVEZ_MAX_S + idle_s, (max(livez.latencies_s), idle_s, sent.seconds)


async def check_costliest_long_text_request(base: str, model: str) -> None:
    """Texts at --max-text-tokens, longer than the model reads, with the most masks they may hold,
    as many as the server admits: answered in time, each text's windows and predictions as asked."""
    sent, idle_s, livez = await costliest_alone(base, "long")
    costly = sent.admitted.body
    # Not vacuous: at least one text of --max-text-tokens, longer than the model reads, is admitted.
    assert costly is not None and sent.admitted.size >= 1, f"{model}: no long text admitted"
    masks = DEFAULTS.masks_allowed(DEFAULTS.max_text_tokens, MODEL_TOKENS)
    print(
        f"figures: the costliest long-text request admitted on {model}, {sent.admitted.size} texts of "
        f"{DEFAULTS.max_text_tokens} tokens, {masks} masks each, top_k {costly['parameters']['top_k']}: "
        f"{sent.seconds:.1f}s, {len(sent.body)} bytes; /livez max {max(livez.latencies_s) * 1000:.0f} ms "
        f"(idle {idle_s * 1000:.0f} ms)"
    )
    check_in_time_with_livez_fast(sent, idle_s, livez)
    assert all(text.count("[MASK]") == masks for text in costly["inputs"])
    check_answer(sent.body, costly)
    assert sent.headers["X-Text-Windows"] == ", ".join([str(long_text_windows())] * sent.admitted.size)


async def test_costliest_long_text_request_ends_in_time_with_livez_fast(tmp_path: Path) -> None:
    with maskserve_process("--log-level", "warning", log_dir=tmp_path) as server:
        await check_costliest_long_text_request(server.url, "the default model")


async def test_costliest_long_text_request_on_bert_base_shape_ends_in_time_with_livez_fast(
    bert_base_server: ServerProcess,
) -> None:
    await check_costliest_long_text_request(bert_base_server.url, "bert-base's shape")


async def test_costliest_scoring_request_on_bert_base_shape_ends_in_time_with_livez_fast(
    bert_base_server: ServerProcess,
) -> None:
    sent, idle_s, livez = await costliest_alone(bert_base_server.url, "score")
    print(
        f"figures: the costliest /score admitted on bert-base's shape, {sent.admitted.size} tokens: "
        f"{sent.seconds:.1f}s; /livez max {max(livez.latencies_s) * 1000:.0f} ms (idle {idle_s * 1000:.0f} ms)"
    )
    check_in_time_with_livez_fast(sent, idle_s, livez)
    check_scores(sent.body, sent.admitted)
    # Past what it admits, a text (here one longer than the model reads, whose every token costs a
    # window of the model's length on a model this size) is refused at once for its measured cost,
    # naming it, rather than admitted and left to time out: the cost, not a fixed limit, bounds it.
    longer = max(sent.admitted.size + 1, MODEL_TOKENS)
    if longer <= DEFAULTS.max_score_tokens:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
            status, body, seconds = await post_json(
                session, bert_base_server.url + "/score", costliest_score_body(DEFAULTS, longer)
            )
        error = json.loads(body)
        assert (status, error["error_type"]) == (422, "request_too_costly"), body[:300]
        assert "would take about" in error["error"] and seconds < REFUSED_WITHIN_S


async def scoring_client(
    session: aiohttp.ClientSession, base: str, found: Admitted, ends: float
) -> list[tuple[int, float]]:
    """The costliest scoring request back to back until ``ends``: (status, seconds) of each.

    Refused for the work ahead (503), it comes back after Retry-After, scaled down; refused as too
    costly (422: the server measured itself slower since), it stops, as a client must change such
    a request. Each refusal costs the server a parse of a long text, so the client does not
    hammer it."""
    results: list[tuple[int, float]] = []
    while time.monotonic() < ends and len(results) < 1_000:  # bounded by time and by count
        sent = await send_costliest(session, base, "score", found)
        found = sent.admitted  # the size the server takes in, from now on
        results.append((sent.status, sent.seconds))
        if sent.status == 200:
            check_scores(sent.body, found)
        elif sent.status == 503:
            retry_after = float(sent.headers["Retry-After"]) / RETRY_AFTER_SCALE
            await asyncio.sleep(max(0.0, min(retry_after, ends - time.monotonic())))
        else:
            assert (sent.status, json.loads(sent.body)["error_type"]) == (422, "request_too_costly"), sent.body[:500]
            break
    return results


async def test_costliest_scoring_requests_back_to_back_leave_fill_mask_clients_answered(tmp_path: Path) -> None:
    with maskserve_process("--log-level", "warning", log_dir=tmp_path) as server:
        found = await find_costliest(server.url, "score")
        sentences = make_sentences(50)
        idle_s = await idle_livez_s(server.url)
        livez = Prober(server.url, "/livez").start()
        stop = asyncio.Event()
        try:
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
                normal = [
                    asyncio.create_task(normal_client(session, server.url + "/", sentences, stop))
                    for _ in range(NORMAL_CLIENTS)
                ]
                ends = time.monotonic() + SUSTAIN_S
                scoring = await asyncio.gather(
                    *(scoring_client(session, server.url, found, ends) for _ in range(SCORING_CLIENTS))
                )
                stop.set()
                statuses = sum((await asyncio.gather(*normal)), Counter())
        finally:
            livez.stop()
    results = [result for client in scoring for result in client]
    admitted = [seconds for status, seconds in results if status == 200]
    longest = max(admitted, default=0.0)
    print(
        f"figures: {found.size} tokens found; {len(admitted)} of {len(results)} admitted, longest {longest:.1f}s; "
        f"/livez max {max(livez.latencies_s) * 1000:.0f} ms (idle {idle_s * 1000:.0f} ms); {dict(statuses)}"
    )
    # Each takes about the whole request timeout: admitted when the work ahead leaves it time,
    # else refused (503, Retry-After), or as too costly once the server measured itself slower.
    assert {status for status, _ in results} <= {200, 422, 503} and admitted, results
    assert longest < DEFAULTS.request_timeout + SCORE_SLACK_S
    # Fill-mask clients keep being answered; while a scoring request runs, a text may be refused at
    # the door (503, Retry-After) when the work ahead of it would outlast its deadline, never
    # failed or left to time out.
    assert set(statuses) <= {200, 503} and statuses[200] > 0, statuses
    assert set(livez.statuses) == {200}, Counter(livez.statuses)
    assert max(livez.latencies_s) < LIVEZ_MAX_S + idle_s, (max(livez.latencies_s), idle_s)
