"""Soak: a real ``python -m maskserve`` on the default model, offered about twice its capacity
with mixed lengths while some clients hang up mid-request.

Checks what must hold however fast the machine is: every request the client kept gets an answer,
only 200/503/504, resident memory stays bounded, and once the load stops and the connections
close, the process holds no more file descriptors or threads than before. Bounded by
``MASKSERVE_SOAK_SECONDS`` (CI: the default below); loopback only. Figures go to
``artifacts/soak.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from tests.live_server import start_maskserve, wait_until_ready
from tests.paths import ROOT
from tests.system.test_load import sentences

# serial: it measures latency and memory under load, which a test beside it would move.
pytestmark = [pytest.mark.load, pytest.mark.serial]

SOAK_SECONDS = float(os.environ.get("MASKSERVE_SOAK_SECONDS", "20"))
TIMEOUT_S = 2.0
HANG_UP_SHARE = 0.1  # of requests whose client leaves mid-flight


def proc_status(pid: int) -> dict[str, int]:
    """Resident memory (kB), open file descriptors and threads of ``pid``, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {
        "rss_kb": int(fields["VmRSS"].split()[0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": len(os.listdir(f"/proc/{pid}/task")),
    }


async def measure_capacity(session: aiohttp.ClientSession, url: str, texts: list[str], seconds: float = 3.0) -> float:
    """Requests per second answered in a closed loop of 16 clients: the server's capacity here."""
    done = 0
    stop_at = time.monotonic() + seconds

    async def client(index: int) -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            async with session.post(url, data=texts[(index * 7 + done) % len(texts)]) as response:
                await response.read()
                done += response.status == 200

    await asyncio.gather(*(client(i) for i in range(16)))
    return done / seconds


@pytest.mark.slow
async def test_twice_capacity_with_hang_ups_answers_everything_and_leaks_nothing(tmp_path: Path) -> None:
    server = start_maskserve(
        "--max-queue", "64", "--request-timeout", str(TIMEOUT_S), "--log-level", "error", log_path=tmp_path / "soak.log"
    )
    url = server.url + "/"
    texts = sentences(seed=11)
    rng = random.Random(3)
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    hung_up = 0
    try:
        await asyncio.to_thread(wait_until_ready, server)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            capacity = await measure_capacity(session, url, texts)
            # Warm: every shape class seen, allocator caches grown; the baseline comes after.
            before = proc_status(server.process.pid)
            rate = 2 * capacity
            tasks: list[asyncio.Task[None]] = []

            async def one(text: str) -> None:
                try:
                    async with session.post(url, data=text) as response:
                        await response.read()
                        statuses[response.status] += 1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 (any client-side failure is a finding)
                    failures.append(type(exc).__name__)

            started = time.monotonic()
            sent = 0
            while time.monotonic() - started < SOAK_SECONDS:
                # Open loop: arrivals at twice capacity, whatever the server answers.
                task = asyncio.create_task(one(rng.choice(texts)))
                tasks.append(task)
                sent += 1
                if rng.random() < HANG_UP_SHARE:
                    hung_up += 1
                    asyncio.get_running_loop().call_later(rng.uniform(0.001, 0.5), task.cancel)
                await asyncio.sleep(rng.expovariate(rate))
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            during = proc_status(server.process.pid)
        # The load is over and every connection closed; give the server a moment to reap them.
        await asyncio.sleep(2)
        after = proc_status(server.process.pid)
        async with aiohttp.ClientSession() as session, session.post(url, data="paris is the [MASK] of france.") as r:
            assert r.status == 200
        assert server.running
    finally:
        server.stop()

    answered = sum(statuses.values())
    cancelled = sum(1 for t in tasks if t.cancelled())
    assert failures == [], Counter(failures)
    assert answered + cancelled == sent  # every request the client kept got an answer
    assert set(statuses) <= {200, 503, 504}, statuses
    assert statuses[200] > 0
    assert after["rss_kb"] < before["rss_kb"] * 1.5, (before, after)
    assert after["fds"] <= before["fds"] + 2, (before, during, after)
    assert after["threads"] <= before["threads"] + 2, (before, during, after)
    figures = {
        "seconds": SOAK_SECONDS,
        "capacity_rps": round(capacity, 1),
        "offered_rps": round(rate, 1),
        "requests": sent,
        "achieved_rps": round(sent / SOAK_SECONDS, 1),
        "hung_up": cancelled,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "before": before,
        "during": during,
        "after": after,
    }
    print("soak:", json.dumps(figures))
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "soak.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
