"""Circuit breaking through the real app and HTTP: 503 at the door, 504 on deadlines, clients that leave."""

from __future__ import annotations

import asyncio

import aiohttp

from maskserve.serving.costs import BatchReport
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, EchoModel, default_parts, holding, wait_for_depth, wait_until_entered


async def test_full_queue_answers_503_with_retry_after_before_reading_the_body(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=2, max_body_bytes=1024)
    async with holding(client, model, queued=["b [MASK]", "b [MASK]"]) as held:
        # A body over the size limit would be a 413 if anything read it: the breaker answers first.
        response = await client.post("/", data=b"x" * 4096)
        assert response.status == 503
        assert int(response.headers["Retry-After"]) >= 1
        body = await response.json()
        assert body["error_type"] == "overloaded"
        assert body["request_id"] == response.headers["X-Request-Id"]
        assert default_parts(client).admission.refused["queue_full"] == 1
    assert await held.statuses() == [200, 200, 200]


async def test_predicted_wait_beyond_the_request_deadline_answers_503(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    batcher = default_parts(client).batcher
    batcher.cost.observe(BatchReport(size=1, real_tokens=4, padded_tokens=4, seconds=3.0, failed=0))
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        response = await client.post("/", data="b [MASK]", headers={"X-Request-Timeout": "0.5"})
        assert response.status == 503
        assert "Retry-After" in response.headers
        assert (await response.json())["error_type"] == "overloaded"
    finally:
        model.release()
    assert (await busy).status == 200


async def test_get_routes_are_never_shed(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=1)
    async with holding(client, model, queued=["b [MASK]"]) as held:
        assert (await client.post("/", data="c [MASK]")).status == 503
        # While inference requests are shed, every other route answers as it always does.
        missing = await client.get("/no-such-page")
        assert missing.status == 404 and (await missing.json())["error_type"] == "not_found"
        page = await client.get("/")
        assert page.status == 200 and page.content_type == "text/html"
        for path in ("/livez", "/readyz", "/metrics", "/info", "/openapi.json"):
            assert (await client.get(path)).status == 200, path
    assert await held.statuses() == [200, 200]


async def test_deadline_answers_504_at_once_while_the_model_is_stuck(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]", headers={"X-Request-Timeout": "0.2"}))
        await wait_until_entered(model)
        response = await busy  # the forward pass is still held: the answer cannot wait for it
        assert response.status == 504
        body = await response.json()
        assert body["error_type"] == "timeout"
    finally:
        model.release()


async def test_client_cannot_lengthen_the_server_deadline(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, request_timeout=0.2)
    model.hold()
    try:
        response = await client.post("/", data="a [MASK]", headers={"X-Request-Timeout": "60"})
        assert response.status == 504
    finally:
        model.release()


async def test_bad_timeout_header_answers_400_naming_it(make_client: ClientFactory) -> None:
    client = await make_client(engine=ControlledModel())
    for value in ("soon", "-1", "0", "nan", "inf"):
        response = await client.post("/", data="a [MASK]", headers={"X-Request-Timeout": value})
        assert response.status == 400, value
        body = await response.json()
        assert body["error_type"] == "invalid_header"
        assert "X-Request-Timeout" in body["error"]


async def test_queued_request_whose_deadline_passed_never_costs_a_forward_pass(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        late = await client.post("/", data="late late [MASK]", headers={"X-Request-Timeout": "0.1"})
        assert late.status == 504
    finally:
        model.release()
    assert (await busy).status == 200
    assert (await client.post("/", data="next [MASK]")).status == 200
    ran = [ids for batch in model.batches for ids in batch]
    assert EchoModel().encode("late late [MASK]") not in ran
    assert default_parts(client).batcher.drops.expired == 1


async def test_clients_that_disconnect_while_queued_are_dropped_before_inference(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    batcher = default_parts(client).batcher
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        url = client.make_url("/")
        leavers = 6
        async with aiohttp.ClientSession() as other:
            tasks = [asyncio.create_task(other.post(url, data=f"leaver {'x ' * n}[MASK]")) for n in range(leavers)]
            await wait_for_depth(batcher, leavers)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # Closing the session closed the connections: aiohttp cancels their handlers.
        stayer = asyncio.create_task(client.post("/", data="stayer [MASK]"))
        await asyncio.sleep(0.1)
    finally:
        model.release()
    assert (await busy).status == 200
    assert (await stayer).status == 200
    ran = [ids for batch in model.batches[1:] for ids in batch]
    assert ran == [EchoModel().encode("stayer [MASK]")]
    assert batcher.drops.abandoned == leavers


async def test_poisoned_input_answers_500_alone_and_its_batch_neighbours_200(make_client: ClientFactory) -> None:
    model = ControlledModel()
    model.poisoned.add(EchoModel().encode("poison pill [MASK]"))
    client = await make_client(engine=model)
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        texts = ["one [MASK]", "poison pill [MASK]", "three [MASK]", "four [MASK]"]
        tasks = [asyncio.create_task(client.post("/", data=t)) for t in texts]
        await wait_for_depth(default_parts(client).batcher, len(texts))
    finally:
        model.release()
    await busy
    responses = await asyncio.gather(*tasks)
    assert [r.status for r in responses] == [200, 500, 200, 200]
    error = await responses[1].json()
    assert error["error_type"] == "inference_failed"
    assert "injected" not in error["error"] and "RuntimeError" not in error["error"]
    assert max(model.batch_sizes()) == 4  # they really shared a forward pass before isolation
