"""Concurrency 1, interleaved: each sentence sent to every server in turn, and to the offline call.

A closed loop at concurrency 1 measures one server for a while, then the next: on a shared machine
the drift between those windows (another job, a cache, the CPU's clock) can be larger than the
difference being measured. Here every sentence is sent to each server, one request at a time,
right after one another, and then handed to one offline ``pipeline`` call in this process, in an
order that rotates with each sentence, so that drift hits every system alike and each sentence
gives a *paired* difference between any two of them. Every answer is checked as the closed loop
checks it. Plain keep-alive ``http.client`` connections, one per server: the client's own cost is
small and the same for all.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .load import Expected, check_answer, is_loopback, percentile

OFFLINE = "one offline pipeline call"


@dataclass
class Interleaved:
    """Per system, one latency per sentence (in ms), in the same sentence order for all."""

    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    wrong: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    def p(self, system: str, q: float) -> float:
        return percentile(self.latencies_ms[system], q)

    def paired(self, system: str, other: str) -> float:
        """Median over sentences of ``system``'s latency minus ``other``'s, in ms."""
        a, b = self.latencies_ms[system], self.latencies_ms[other]
        return statistics.median(x - y for x, y in zip(a, b))


class _Client:
    """One keep-alive connection to a server on loopback; reconnects once if the server closed it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if not parts.hostname or not is_loopback(parts.hostname):
            raise ValueError(f"load goes to loopback only, not {parts.hostname!r}")
        self.host, self.port, self.path = parts.hostname, parts.port or 80, parts.path or "/"
        self.connection = http.client.HTTPConnection(self.host, self.port, timeout=120)

    def post(self, body: bytes) -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self.connection.request("POST", self.path, body=body, headers={"Content-Type": "text/plain"})
                response = self.connection.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, ConnectionError):
                self.connection.close()
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=120)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.connection.close()


def run_interleaved(
    urls: Mapping[str, str],
    sentences: Sequence[str],
    expected: Sequence[Expected],
    offline_call: Callable[[str], Any] | None = None,
) -> Interleaved:
    """One pass over ``sentences``: each to every server of ``urls`` and to ``offline_call``."""
    clients = {name: _Client(url) for name, url in urls.items()}
    systems = [*clients, *([OFFLINE] if offline_call is not None else [])]
    result = Interleaved({name: [] for name in systems})
    try:
        for k, sentence in enumerate(sentences):
            shift = k % len(systems)
            for system in systems[shift:] + systems[:shift]:
                started = time.perf_counter()
                if system == OFFLINE:
                    assert offline_call is not None
                    answer: Any = offline_call(sentence)
                    status = 200
                else:
                    status, body = clients[system].post(sentence.encode("utf-8"))
                    answer = json.loads(body) if status == 200 else None
                result.latencies_ms[system].append((time.perf_counter() - started) * 1000)
                if status != 200:
                    result.failed[system] += 1
                elif check_answer(answer, expected[k]) is not None:
                    result.wrong[system] += 1
    finally:
        for client in clients.values():
            client.close()
    return result
