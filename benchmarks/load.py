"""A bounded closed-loop load generator: N clients, a fixed request count and a time cap.

Each client sends the next sentence of the mix as soon as its previous answer is back, so
throughput measures the server, not an arrival schedule. Every answer is checked to belong to its
own request: the top prediction's token must be among the offline pipeline's top answers for that
sentence, and its ``sequence`` (the sentence with the mask filled) must be the offline one for that
token. A reply meant for another sentence fails the check even when its token agrees. Loopback
only: :func:`run_load` refuses any other host (any of 127.0.0.0/8, so a fleet's replicas and its
balancer can each have their own address).
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

# token id -> the filled-in sentence, for each offline top answer of one sentence
Expected = Mapping[int, str]

MAX_FAILURES_KEPT = 20


def is_loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def check_answer(answer: Any, expected: Expected) -> str | None:
    """``None`` when ``answer`` (the pipeline's JSON for one sentence) belongs to its sentence.

    Otherwise a short reason. Only the top prediction is compared: near-ties may reorder the
    rest between a batched and an unbatched run, but never move the top token out of the top 5.
    """
    if not isinstance(answer, list) or not answer or not isinstance(answer[0], dict):
        return f"not a list of predictions: {str(answer)[:80]}"
    top = answer[0]
    token, sequence = top.get("token"), top.get("sequence")
    if not isinstance(token, int) or token not in expected:
        return f"top token {token!r} is not among the offline top answers"
    if sequence != expected[token]:
        return f"sequence {sequence!r} belongs to another sentence (expected {expected[token]!r})"
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class LoadResult:
    """One closed-loop run: what was sent, what came back, how fast."""

    concurrency: int
    sent: int = 0
    correct: int = 0
    duration_s: float = 0.0
    capped: bool = False  # the time cap stopped it before the request count
    statuses: Counter[str] = field(default_factory=Counter)
    wrong: int = 0
    first_wrong: str | None = None
    latencies_ms: list[float] = field(default_factory=list)
    # Every request that did not end in a correct answer, counted above; the first few described
    # here with when they happened (seconds since the start), for the reader of a failed test.
    failures: list[str] = field(default_factory=list)
    refused_without_retry_after: int = 0  # 503s that do not say when to come back
    stopped: bool = False  # ended by the caller's ``stop`` event, not by a count or the time cap

    def fail(self, at_s: float, what: str) -> None:
        if len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append(f"{at_s:.2f}s: {what}")

    def count_answer(self, answer: Any, expected: Expected, at_s: float, which: str) -> None:
        """Count ``answer`` (to ``which``, e.g. "sentence 3") correct, or wrong and described."""
        reason = check_answer(answer, expected)
        if reason is None:
            self.correct += 1
        else:
            self.wrong += 1
            self.first_wrong = self.first_wrong or f"{which}: {reason}"
            self.fail(at_s, f"wrong answer to {which}: {reason}")

    @property
    def failed(self) -> int:
        """Requests that got no correct answer: connection errors, non-200 statuses, wrong answers."""
        return self.sent - self.correct

    @property
    def rps(self) -> float:
        """Correct answers per second: a wrong or failed answer is not throughput."""
        return self.correct / self.duration_s if self.duration_s > 0 else 0.0

    def p(self, q: float) -> float:
        return percentile(self.latencies_ms, q)


async def run_load(
    url: str,
    sentences: Sequence[str],
    expected: Sequence[Expected],
    *,
    concurrency: int,
    requests: int,
    time_cap_s: float,
    stop: asyncio.Event | None = None,
) -> LoadResult:
    """Send ``requests`` requests (sentence ``i % len(sentences)`` for the i-th) from
    ``concurrency`` clients; stop sending at ``time_cap_s``, or once ``stop`` is set (a test that
    keeps load on while something else happens). Each request's latency is its own round trip,
    answer read included."""
    host = urlsplit(url).hostname
    if not is_loopback(host):
        raise ValueError(f"load goes to loopback only, not {host!r}")
    if len(expected) != len(sentences):
        raise ValueError("one expected answer per sentence")
    result = LoadResult(concurrency)
    counter = itertools.count()
    loop = asyncio.get_running_loop()
    # A request may take long under the seed design at c=64 (it queues behind all others);
    # the cap on sending plus this bound keeps every run finite.
    timeout = aiohttp.ClientTimeout(total=time_cap_s + 60)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)

    async def client(session: aiohttp.ClientSession, stop_at: float) -> None:
        while True:
            i = next(counter)
            if i >= requests:
                return
            if stop is not None and stop.is_set():
                result.stopped = True
                return
            if loop.time() >= stop_at:
                result.capped = True  # requests were left unsent
                return
            k = i % len(sentences)
            result.sent += 1
            started = time.perf_counter()
            try:
                async with session.post(url, data=sentences[k].encode("utf-8")) as response:
                    body = await response.read()
                    status = response.status
                    retry_after = response.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError) as exc:
                result.statuses[type(exc).__name__] += 1
                result.fail(loop.time() - begun, f"sentence {k}: {type(exc).__name__}: {exc}")
                continue
            result.latencies_ms.append((time.perf_counter() - started) * 1000)
            result.statuses[str(status)] += 1
            if status != 200:
                if status == 503 and retry_after is None:
                    result.refused_without_retry_after += 1
                result.fail(loop.time() - begun, f"sentence {k}: {status} (Retry-After {retry_after}) {body[:120]!r}")
                continue
            try:
                answer = json.loads(body)
            except ValueError:
                answer = body[:80]  # not JSON: check_answer says so
            result.count_answer(answer, expected[k], loop.time() - begun, f"sentence {k}")

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        begun = loop.time()
        await asyncio.gather(*(client(session, begun + time_cap_s) for _ in range(concurrency)))
        result.duration_s = loop.time() - begun
    return result
