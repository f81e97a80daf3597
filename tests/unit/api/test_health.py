"""/livez and /readyz: honest under a stuck batch, a deep queue, a drain; never queued or shed; never load."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from maskserve.request.keys import SERVICE_KEY
from maskserve.serving.costs import BatchReport
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, holding, wait_until_entered

Client = TestClient[web.Request, web.Application]


async def probe(client: Client, path: str) -> tuple[int, dict[str, Any]]:
    response: ClientResponse = await client.get(path)
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.headers["Cache-Control"] == "no-store"
    return response.status, await response.json()


def problem_codes(body: dict[str, Any]) -> list[str]:
    return [p["code"] for p in body["problems"]]


async def test_idle_server_is_live_and_ready(make_client: ClientFactory) -> None:
    client = await make_client()
    status, body = await probe(client, "/livez")
    assert (status, body["status"], body["problems"]) == (200, "ok", [])
    assert body["busy"] is False
    status, body = await probe(client, "/readyz")
    assert (status, body["status"], body["problems"]) == (200, "ok", [])
    assert body["queue_depth"] == 0
    status, body = await probe(client, "/livez")
    assert body["stall_budget_s"] == 10.0  # unmeasured (no warm-up): the floor, --stall-timeout


async def test_operability_endpoints_never_run_the_model(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    for path in ("/livez", "/readyz", "/metrics", "/info"):
        assert (await client.get(path)).status == 200, path
    assert model.batches == []


async def test_stuck_forward_pass_turns_livez_503_and_recovers_when_it_ends(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, stall_timeout=0.05)
    model.hold()
    try:
        stuck = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        await asyncio.sleep(0.1)  # past the 0.05 s stall budget, with the pass still held
        # Answered while the inference thread is blocked: the probe never waits for it.
        status, body = await probe(client, "/livez")
        assert status == 503
        assert problem_codes(body) == ["stalled"]
        assert "--stall-timeout 0.05s" in body["problems"][0]["message"]
        assert body["busy"] is True and body["busy_for_s"] > 0.05
        status, body = await probe(client, "/readyz")
        assert status == 503
        assert "stalled" in problem_codes(body)
    finally:
        model.release()
    assert (await stuck).status == 200
    assert (await probe(client, "/livez"))[0] == 200


async def test_busy_server_within_its_stall_budget_is_live(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)  # default floor: 10 s
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        status, body = await probe(client, "/livez")
        assert status == 200
        assert body["busy"] is True
    finally:
        model.release()
    assert (await busy).status == 200


async def test_the_stall_budget_grows_with_the_longest_batch_the_limits_admit(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, stall_timeout=0.05, max_batch_tokens=1000)
    batcher = default_parts(client).batcher
    # Measured: a pass costs 0.02 s plus 0.1 ms a token, so a full budget of 1000 tokens takes
    # 0.12 s, and four times that is the budget, far above the 0.05 s floor.
    for tokens in (100, 200, 400):
        seconds = 0.02 + tokens * 1e-4
        batcher.cost.observe(BatchReport(size=1, real_tokens=tokens, padded_tokens=tokens, seconds=seconds, failed=0))
    assert batcher.forecast.stall_budget(0.05) == pytest.approx(4 * 0.12, rel=0.05)
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        await asyncio.sleep(0.2)  # past the floor, within the derived budget
        status, body = await probe(client, "/livez")
        assert status == 200, body
        assert body["stall_budget_s"] == pytest.approx(0.48, rel=0.05)
        await asyncio.sleep(0.4)  # past the derived budget too
        status, body = await probe(client, "/livez")
        assert status == 503 and problem_codes(body) == ["stalled"]
    finally:
        model.release()
    assert (await busy).status == 200


async def test_a_full_queue_keeps_readyz_200_while_requests_are_refused_503(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=2, max_inputs=2)
    async with holding(client, model, queued=["b0 [MASK]", "b1 [MASK]"]) as held:
        # Load is no part of readiness: the replica stays in its Service, and clients get the
        # 503 with Retry-After, not a refused connection.
        status, body = await probe(client, "/readyz")
        assert status == 200 and problem_codes(body) == []
        assert (body["queue_depth"], body["max_queue"]) == (2, 2)
        assert (await probe(client, "/livez"))[0] == 200
        refused = await client.post("/", data="c [MASK]")
        assert refused.status == 503 and "Retry-After" in refused.headers
        # Probes, metrics and info are never shed, even while inference requests are.
        assert (await client.get("/metrics")).status == 200
        assert (await client.get("/info")).status == 200
    assert await held.statuses() == [200, 200, 200]
    assert (await probe(client, "/readyz"))[0] == 200


async def test_a_predicted_wait_past_the_deadline_is_refused_at_the_door_and_readyz_stays_200(
    make_client: ClientFactory,
) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, request_timeout=14.0)
    # As if passes over 100 and 200 tokens had each taken 8 s: 8 s per pass, whatever its size.
    # Idle, one more text is predicted to take 8 s, within the 14 s deadline with admission's
    # margin (12 s); once a pass is in flight, about 8 + 8 = 16 s: beyond it.
    for tokens in (100, 200):
        report = BatchReport(size=10, real_tokens=tokens, padded_tokens=tokens, seconds=8.0, failed=0)
        default_parts(client).batcher.cost.observe(report)
    assert (await probe(client, "/readyz"))[0] == 200
    model.hold()
    try:
        slow = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        status, body = await probe(client, "/readyz")
        assert status == 200 and body["predicted_wait_s"] > 14.0
        refused = await client.post("/", data="b [MASK]")
        assert refused.status == 503
        assert (await refused.json())["error_type"] == "overloaded"
    finally:
        model.release()
    assert (await slow).status == 200


async def test_draining_server_is_live_but_not_ready(make_client: ClientFactory) -> None:
    client = await make_client()
    default_parts(client).batcher.close()
    status, body = await probe(client, "/readyz")
    assert status == 503
    assert problem_codes(body) == ["draining"]
    assert (await probe(client, "/livez"))[0] == 200


async def test_in_the_drain_delay_readyz_fails_while_requests_are_still_answered(make_client: ClientFactory) -> None:
    client = await make_client()
    client.app[SERVICE_KEY].lifecycle.start_draining()  # what the first SIGTERM does (serve.StopSignals)
    status, body = await probe(client, "/readyz")
    assert status == 503
    assert problem_codes(body) == ["draining"]
    assert (await probe(client, "/livez"))[0] == 200
    answered = await client.post("/", data="Paris is the [MASK] of France.")
    assert answered.status == 200
    assert answered.headers["Connection"] == "close"  # reconnect, and be routed elsewhere


async def test_dead_batch_loop_turns_livez_503(make_client: ClientFactory) -> None:
    client = await make_client()
    loop_task = client.app[SERVICE_KEY].loaded.batch_loop  # type: ignore[union-attr]
    loop_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop_task
    status, body = await probe(client, "/livez")
    assert status == 503
    assert problem_codes(body) == ["batch_loop_stopped"]
