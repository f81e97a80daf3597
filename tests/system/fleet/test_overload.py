"""Load behind HAProxy: an overloaded replica, a saturated fleet, and the costliest request.

Readiness is no load signal (a replica's ``/readyz`` stays 200 however busy it is); load reaches
HAProxy as a weight from each replica's agent (``--agent-port``), and overload reaches clients as
maskserve's own 503 with Retry-After.

- One replica flooded directly: its agent lowers its weight, so the balancer sends it less, and
  it never leaves rotation. With the example's layer-7 retry line on, a request it refuses at its
  door is sent again elsewhere and no client sees a 503; with it off, what gets through is the
  replica's honest 503 with Retry-After.
- The whole fleet saturated through the balancer: clients get maskserve's 503 with Retry-After,
  never a refused connection or HAProxy's own 503, and every replica stays in rotation.
- The costliest request the replicas' limits admit, through the balancer beside the steady load:
  no replica leaves rotation or fails a probe, and the steady clients' p99 stays bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from benchmarks.costliest import Prober, costliest_body, post_json
from benchmarks.haproxy import HAProxy
from maskserve.config.flags import load_settings
from maskserve.config.settings import Settings
from tests.system.fleet.fleet import (
    REPLICA_ARGS,
    Replica,
    Rotation,
    Workload,
    in_rotation,
    load_figures,
    out_of_rotation,
    record,
    steady_load,
)

# serial: the fleet measures recovery and weights in time, and its balancer and Prometheus are one each.
pytestmark = [pytest.mark.fleet, pytest.mark.serial]

FLOOD_S = 6.0
BACK_OFF_S = 0.05  # a client honouring Retry-After, scaled down
# One replica admits a batch in flight and --max-queue more texts (32 + 32): 96 clients keep one
# replica's queue full, 300 keep all three full.
ONE_REPLICA_CLIENTS = 96
WHOLE_FLEET_CLIENTS = 300
# The steady clients' p99 while the costliest request runs: it is served by one replica, in
# several passes, while the agent sends new requests to the two others. Measured well under
# this (artifacts/fleet.json, "costliest_request"); a replica stalled by the request, or
# requests sent back to it, would be far over it.
COSTLIEST_P99_BOUND_S = 5.0
# Tries of the costliest request that may be refused 503 (a replica's queue had something in it).
MAX_ATTEMPTS = 100


def replica_settings() -> Settings:
    """The limits the fleet's replicas run with (fleet.py), read from their flags as they read them."""
    return load_settings(list(REPLICA_ARGS), env={})


@dataclass
class Flood:
    statuses: Counter[str] = field(default_factory=Counter)
    refused_without_retry_after: int = 0
    kinds: Counter[str] = field(default_factory=Counter)  # error_type of every 503


async def flood(url: str, text: str, seconds: float, clients: int) -> Flood:
    """``clients`` closed-loop clients at ``url`` for ``seconds``."""
    result = Flood()
    stop_at = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop_at:
            try:
                async with session.post(url, data=text.encode()) as response:
                    body = await response.read()
                    result.statuses[str(response.status)] += 1
                    if response.status == 503:
                        result.kinds[json.loads(body)["error_type"]] += 1
                        if "Retry-After" not in response.headers:
                            result.refused_without_retry_after += 1
                        await asyncio.sleep(BACK_OFF_S)
            except aiohttp.ClientError as exc:
                result.statuses[type(exc).__name__] += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return result


def probes(replicas: list[Replica], path: str) -> list[Prober]:
    return [Prober(replica.url.rstrip("/"), path, interval_s=0.1).start() for replica in replicas]


def stop_all(probers: list[Prober]) -> dict[str, int]:
    for prober in probers:
        prober.stop()
    return dict(Counter(status for prober in probers for status in prober.statuses))


@pytest.mark.parametrize("l7_retries", [False, True], ids=["checks_only", "l7_retries"])
async def test_an_overloaded_replica_gets_less_weight_and_stays_in_rotation(
    balancer: Callable[..., HAProxy], whole_fleet: list[Replica], workload: Workload, l7_retries: bool
) -> None:
    haproxy = balancer(l7_retries=l7_retries)
    target = whole_fleet[2]
    ready = probes(whole_fleet, "/readyz")
    with Rotation(haproxy) as rotation:
        async with steady_load(haproxy.url, workload) as load:
            started = time.monotonic()
            flooded = await flood(target.url, workload.sentences[0], FLOOD_S, ONE_REPLICA_CLIENTS)
            # The flood over, its queue drains and its weight comes back.
            await rotation.wait_now(target.name, lambda s: s.weight >= 90, timeout_s=15)
    readyz = stop_all(ready)
    result = load.result
    assert result is not None
    lightest = min((s.weight for at, name, s in rotation.changes if name == target.name and at >= started), default=100)
    record(
        f"overload_{'l7_retries' if l7_retries else 'checks_only'}",
        {
            **load_figures(result),
            "flood": dict(flooded.statuses),
            "target_lightest_weight": lightest,
            "retried_by_haproxy": sum(s.retries for s in rotation.latest.values()),
            "readyz": readyz,
        },
    )
    # It really was overloaded: refused at its door, every refusal saying when to come back...
    assert flooded.statuses["503"] > 0 and flooded.refused_without_retry_after == 0, flooded
    # ...its agent told HAProxy so, and HAProxy never took it out: readiness is no load signal.
    assert lightest < 50, rotation.changes
    assert rotation.first(target.name, out_of_rotation, since=started) is None, rotation.changes
    assert readyz == {200: sum(readyz.values())}
    assert result.stopped and result.sent > 0, load.report()
    # Whatever reached a client was a right answer or the replica's honest 503 with Retry-After.
    assert result.wrong == 0 and set(result.statuses) <= {"200", "503"}, load.report()
    assert result.refused_without_retry_after == 0, load.report()
    if l7_retries:
        assert result.failed == 0 and result.correct == result.sent, load.report()


async def test_a_saturated_fleet_answers_503_with_retry_after_and_never_refuses_a_connection(
    balancer: Callable[..., HAProxy], whole_fleet: list[Replica], workload: Workload
) -> None:
    haproxy = balancer(l7_retries=True)  # as the example ships
    ready = probes(whole_fleet, "/readyz")
    with Rotation(haproxy) as rotation:
        started = time.monotonic()
        flooded = await flood(haproxy.url, workload.sentences[1], FLOOD_S, WHOLE_FLEET_CLIENTS)
        await asyncio.sleep(0.5)
    readyz = stop_all(ready)
    record(
        "saturated_fleet",
        {
            "flood": dict(flooded.statuses),
            "refusals": dict(flooded.kinds),
            "retried_by_haproxy": sum(s.retries for s in rotation.latest.values()),
            "readyz": readyz,
        },
    )
    # Every replica refused work, and every refusal reached its client as maskserve's own 503
    # (overloaded, with Retry-After), not HAProxy's "no replica" one or a broken connection.
    assert flooded.statuses["503"] > 0 and flooded.statuses["200"] > 0, flooded
    assert set(flooded.statuses) <= {"200", "503"}, flooded
    assert set(flooded.kinds) == {"overloaded"} and flooded.refused_without_retry_after == 0, flooded
    assert all(rotation.first(r.name, out_of_rotation, since=started) is None for r in whole_fleet), rotation.changes
    assert readyz == {200: sum(readyz.values())}


async def test_the_costliest_request_through_the_balancer_takes_out_no_replica(
    balancer: Callable[..., HAProxy], whole_fleet: list[Replica], workload: Workload
) -> None:
    haproxy = balancer(l7_retries=True)
    costly = costliest_body(replica_settings())
    live, ready = probes(whole_fleet, "/livez"), probes(whole_fleet, "/readyz")
    with Rotation(haproxy) as rotation:
        async with steady_load(haproxy.url, workload) as load:
            started = time.monotonic()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                # It fills a replica's whole queue (--max-inputs = --max-queue): a replica with
                # anything queued refuses it at the door, and the client comes back, as told.
                attempts = 0
                while True:
                    attempts += 1
                    status, body, costly_s = await post_json(session, haproxy.url, costly)
                    if status != 503 or attempts == MAX_ATTEMPTS:
                        break
                    await asyncio.sleep(BACK_OFF_S)
            await asyncio.sleep(1.0)
        for replica in whole_fleet:
            await rotation.wait_now(replica.name, in_rotation, timeout_s=5)
    livez, readyz = stop_all(live), stop_all(ready)
    result = load.result
    assert result is not None
    record(
        "costliest_request",
        {
            **load_figures(result),
            "costliest_status": status,
            "costliest_attempts": attempts,
            "costliest_s": round(costly_s, 2),
            "costliest_bytes": len(body),
            "livez": livez,
            "readyz": readyz,
            "p99_bound_s": COSTLIEST_P99_BOUND_S,
        },
    )
    assert status == 200, body[:500]
    assert all(rotation.first(r.name, out_of_rotation, since=started) is None for r in whole_fleet), rotation.changes
    assert livez == {200: sum(livez.values())} and readyz == {200: sum(readyz.values())}
    assert result.wrong == 0 and result.failed == 0, load.report()
    assert result.p(99) / 1000 < COSTLIEST_P99_BOUND_S, load_figures(result)
