"""One replica overloaded (its queue full, 503 with Retry-After) while the others have room.

A flood that bypasses the balancer (clients sent straight to one replica's port) keeps that
replica's queue at --max-queue. Its ``/readyz`` then fails (``queue_full``) and HAProxy's checks
take it out; but a check runs every 300 ms and the replica passes one whenever its queue dips, so
between checks some requests still reach it and are refused. Measured both ways:

- the checks alone (the example as written): what gets through is the replica's own honest 503
  with ``Retry-After``, never a wrong answer or a broken connection; how many is recorded;
- with the example's layer-7 retry line on (``retry-on ... 503``, the recommended setting): HAProxy
  sends each refused request again to another replica, and no client sees a 503 at all.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from benchmarks.haproxy import HAProxy, ServerState

from .fleet import Replica, Rotation, Workload, in_rotation, load_figures, record, steady_load

pytestmark = pytest.mark.fleet

# 96 clients against a queue of 32: a batch of up to 32 runs, 32 more wait, and the rest retry
# after a short back-off, so the queue refills the moment a batch leaves it.
FLOOD_CLIENTS = 96
FLOOD_S = 6.0
BACK_OFF_S = 0.05  # a client honouring Retry-After, scaled down


@dataclass
class Flood:
    statuses: Counter[str] = field(default_factory=Counter)
    refused_without_retry_after: int = 0


async def flood(url: str, text: str, seconds: float) -> Flood:
    """:data:`FLOOD_CLIENTS` closed-loop clients straight at ``url`` for ``seconds``."""
    result = Flood()
    stop_at = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop_at:
            try:
                async with session.post(url, data=text.encode()) as response:
                    await response.read()
                    result.statuses[str(response.status)] += 1
                    if response.status == 503:
                        if "Retry-After" not in response.headers:
                            result.refused_without_retry_after += 1
                        await asyncio.sleep(BACK_OFF_S)
            except aiohttp.ClientError as exc:
                result.statuses[type(exc).__name__] += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(FLOOD_CLIENTS)))
    return result


def refused_by_check(state: ServerState) -> bool:
    """Out of rotation because /readyz answered an HTTP error (L7STS), not because it was gone."""
    return not state.in_rotation and state.check == "L7STS"


@pytest.mark.parametrize("l7_retries", [False, True], ids=["checks_only", "l7_retries"])
async def test_an_overloaded_replica_is_routed_around(
    balancer: Callable[..., HAProxy], whole_fleet: list[Replica], workload: Workload, l7_retries: bool
) -> None:
    haproxy = balancer(l7_retries=l7_retries)
    target = whole_fleet[2]
    with Rotation(haproxy) as rotation:
        async with steady_load(haproxy.url, workload) as load:
            started = time.monotonic()
            flooded = await flood(target.url, workload.sentences[0], FLOOD_S)
            # The flood over, its queue drains and it comes back.
            await rotation.wait_now(target.name, in_rotation, timeout_s=15)
    result = load.result
    assert result is not None
    retried = sum(s.retries for s in rotation.latest.values())
    flaps = [(round(at - started, 2), s.status, s.check) for at, name, s in rotation.changes if name == target.name]
    record(
        f"overload_{'l7_retries' if l7_retries else 'checks_only'}",
        {
            **load_figures(result),
            "flood": dict(flooded.statuses),
            "target_state_changes": len(flaps),
            "retried_by_haproxy": retried,
            "first_failures": result.failures[:5],
        },
    )
    # It really was overloaded: refused at its door, every refusal saying when to come back...
    assert flooded.statuses["503"] > 0 and flooded.refused_without_retry_after == 0, flooded
    # ...and HAProxy's checks saw /readyz fail and took it out of rotation.
    assert rotation.first(target.name, refused_by_check, since=started) is not None, flaps
    assert result.stopped and result.sent > 0, load.report()
    # Whatever reached a client was a right answer or the replica's honest 503 with Retry-After.
    assert result.wrong == 0 and set(result.statuses) <= {"200", "503"}, load.report()
    assert result.refused_without_retry_after == 0, load.report()
    if l7_retries:
        # Refused requests were sent again to the others (so the zero is the retries' doing).
        assert retried > 0, rotation.latest
        assert result.failed == 0 and result.correct == result.sent, load.report()
