"""request_metrics.py through the real app factory: every response is counted and timed as the
client got it (its final status and error kind, its route's name, its model), errors, redirects,
paths that match no route and clients that left included."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient

from maskserve.request.keys import SERVICE_KEY
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, wait_until_entered
from tests.models import LONG_TEXT

Client = TestClient[web.Request, web.Application]


def requests(client: Client, **labels: str) -> float:
    """The app's ``maskserve_requests_total`` samples that carry ``labels``, summed."""
    return counted(client, "maskserve_requests_total", **labels)


def counted(client: Client, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    registry = client.app[SERVICE_KEY].metrics.registry
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == name and wanted <= set(sample.labels.items())
    )


async def test_a_success_is_counted_under_its_route_and_model(make_client: ClientFactory) -> None:
    client = await make_client(model_name="fill-mask-bert")
    assert (await client.post("/", data="a [MASK] here.")).status == 200
    assert requests(client, route="fill_mask", status="200", kind="ok", model="fill-mask-bert") == 1
    assert counted(client, "maskserve_request_duration_seconds_count", route="fill_mask", model="fill-mask-bert") == 1
    # Its one text's wait in the queue, under the same model.
    assert counted(client, "maskserve_queue_wait_seconds_count", model="fill-mask-bert") == 1


async def test_each_texts_windows_are_counted_under_its_model(make_client: ClientFactory) -> None:
    client = await make_client(model_name="fill-mask-bert")
    assert (await client.post("/", json={"inputs": [LONG_TEXT, "a [MASK] here."]})).status == 200
    assert (await client.post("/score", json={"inputs": "a cat here."})).status == 200
    assert counted(client, "maskserve_text_windows_count", model="fill-mask-bert") == 3
    assert counted(client, "maskserve_text_windows_sum", model="fill-mask-bert") == 2 + 1 + 1
    assert counted(client, "maskserve_text_windows_bucket", model="fill-mask-bert", le="1.0") == 2


async def test_an_error_is_counted_with_the_status_and_kind_the_client_got(make_client: ClientFactory) -> None:
    client = await make_client()
    assert (await client.post("/", json={"inputs": "a [MASK]", "parameters": {"top_k": 0}})).status == 422
    assert requests(client, route="fill_mask", status="422", kind="invalid_input") == 1
    assert requests(client, status="500") == 0  # never the raw exception


async def test_an_unexpected_failure_is_counted_as_the_fixed_500(make_client: ClientFactory) -> None:
    model = ControlledModel()
    model.encode_error = RuntimeError("tokenizer broke")
    client = await make_client(engine=model)
    assert (await client.post("/", data="a [MASK]")).status == 500
    assert requests(client, route="fill_mask", status="500", kind="internal") == 1


async def test_a_path_that_matches_no_route_is_counted_under_one_label(make_client: ClientFactory) -> None:
    client = await make_client()
    for path in ("/nope", "/wp-admin/setup.php", "/v3/anything"):
        assert (await client.get(path)).status == 404
    assert requests(client, route="unmatched", status="404", kind="not_found") == 3
    assert counted(client, "maskserve_request_duration_seconds_count", route="unmatched") == 3


async def test_a_redirect_is_counted_with_its_own_status(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.get("/demo?text=x", allow_redirects=False)
    assert response.status == 303
    assert requests(client, route="demo_redirect", status="303", kind="ok") == 1


async def test_a_route_that_names_no_model_is_counted_with_an_empty_model(make_client: ClientFactory) -> None:
    client = await make_client()
    assert (await client.get("/livez")).status == 200
    assert requests(client, route="livez", status="200", kind="ok", model="") == 1


async def test_a_client_that_leaves_before_its_answer_is_counted_as_499(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    model.hold()
    try:
        leaving = asyncio.create_task(client.post("/", data="a [MASK]"))
        await wait_until_entered(model)
        leaving.cancel()  # the connection closes, and the server cancels the handler
        for _ in range(500):
            if requests(client, route="fill_mask", status="499"):
                break
            await asyncio.sleep(0.01)
    finally:
        model.release()
    assert requests(client, route="fill_mask", status="499", kind="client_closed") == 1
    assert requests(client, route="fill_mask", status="200") == 0
