"""http/app.py: what create_app wires (the service, the chain, the routes, the templates), what its
lifecycle context starts and stops, draining on shutdown, and loading named models."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp_jinja2
import jinja2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, make_mocked_request

from maskserve.config.model_configs import model_configs
from maskserve.config.settings import Settings, setting_fields
from maskserve.engine import ModelLoadError
from maskserve.errors import ShuttingDown
from maskserve.http.app import (
    SETTINGS_CHECKS,
    close_connections_while_draining,
    create_app,
    drain_on_shutdown,
    inference_thread,
    load_models,
)
from maskserve.http.routes import ROUTE_ROLES, route_table
from maskserve.middleware.chain import build_chain
from maskserve.middleware.slow_clients import connections_middleware
from maskserve.model_api import Query
from maskserve.request.keys import SERVICE_KEY
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, EchoModel, default_parts, holding, wait_for_depth

Client = TestClient[web.Request, web.Application]
TWO_MODELS = Settings(model=("first=/models/first", "second=/models/second"), warmup=False)


@pytest.fixture
def thread() -> Iterator[ThreadPoolExecutor]:
    """An inference thread handed to the app, and so the test's to stop."""
    executor = inference_thread()
    yield executor
    executor.shutdown(wait=True)


def test_the_service_sits_behind_its_key_with_the_chains_stage_names() -> None:
    settings = Settings(warmup=False)
    app = create_app(settings, engine=EchoModel())
    service = app[SERVICE_KEY]
    assert service.settings is settings
    assert service.middleware == build_chain(settings.middleware, settings).names
    assert service.loaded is None  # nothing loads before the app starts


def test_the_connection_stage_comes_first_whatever_the_chain() -> None:
    app = create_app(Settings(warmup=False), engine=EchoModel(), middlewares="errors,circuit_breaker")
    assert app.middlewares[0] is connections_middleware
    assert app[SERVICE_KEY].middleware == ("errors", "circuit_breaker")
    assert len(app.middlewares) == 3


def test_every_route_of_the_table_is_registered_by_name_with_its_roles() -> None:
    app = create_app(Settings(warmup=False), engine=EchoModel())
    names = {route.kwargs["name"] for route in route_table()}  # type: ignore[attr-defined]
    assert names and names <= set(app.router.named_resources())
    assert app[SERVICE_KEY].routes == ROUTE_ROLES


def test_the_templates_escape_and_refuse_missing_variables() -> None:
    environment = aiohttp_jinja2.get_env(create_app(Settings(warmup=False), engine=EchoModel()))
    assert environment.autoescape is True and environment.undefined is jinja2.StrictUndefined


def test_one_engine_cannot_serve_several_models() -> None:
    with pytest.raises(ValueError, match="engine= serves a server of one model"):
        create_app(TWO_MODELS, engine=EchoModel())


def test_engines_must_be_named_as_the_settings_name_the_models() -> None:
    with pytest.raises(ValueError, match=r"engines= names \['second', 'first'\], but the settings serve"):
        create_app(TWO_MODELS, engines={"second": EchoModel(), "first": EchoModel()})


def test_every_settings_check_is_for_a_setting() -> None:
    assert set(SETTINGS_CHECKS) <= {field.name for field in setting_fields()}


async def test_started_each_model_is_served_by_its_own_engine_and_batcher_on_one_scheduler(
    aiohttp_client: Any,
) -> None:
    engines = {"first": EchoModel(word="one"), "second": EchoModel(word="two")}
    client: Client = await aiohttp_client(create_app(TWO_MODELS, engines=engines))
    service = client.app[SERVICE_KEY]
    assert service.loaded is not None
    assert {name: served.loaded.model for name, served in service.models.items()} == engines
    batchers = [served.loaded.batcher for served in service.models.values()]
    assert batchers[0] is not batchers[1]
    assert {id(lane) for lane in service.scheduler.lanes} == {id(batcher) for batcher in batchers}
    assert not service.loaded.batch_loop.done()


async def test_stopping_the_app_stops_the_loop_and_tokenizer_but_not_a_thread_handed_in(
    aiohttp_client: Any, thread: ThreadPoolExecutor
) -> None:
    client: Client = await aiohttp_client(create_app(Settings(warmup=False), engine=EchoModel(), thread=thread))
    loaded = client.app[SERVICE_KEY].loaded
    assert loaded is not None and loaded.scheduler.executor is thread
    tokenizer = client.app[SERVICE_KEY].default.loaded.tokenizer
    await client.close()
    assert loaded.batch_loop.done() and loaded.scheduler.closed
    with pytest.raises(RuntimeError):
        tokenizer.submit(int)
    assert thread.submit(int, "7").result() == 7


async def test_stopping_the_app_fails_what_is_still_queued_503(aiohttp_client: Any, thread: ThreadPoolExecutor) -> None:
    model = ControlledModel()
    settings = Settings(warmup=False, drain_timeout=0.05)
    client: Client = await aiohttp_client(create_app(settings, engine=model, thread=thread))
    batcher = default_parts(client).batcher
    deadline = asyncio.get_running_loop().time() + 30
    model.hold()
    try:
        busy = asyncio.create_task(batcher.answer([Query(input_ids=(101, 4, 102), top_k=1)], deadline))
        await asyncio.to_thread(model.entered.wait, 5)
        queued = asyncio.create_task(batcher.answer([Query(input_ids=(101, 7, 4, 102), top_k=1)], deadline))
        await wait_for_depth(batcher, 1)
        await client.close()
        with pytest.raises(ShuttingDown):
            await queued
    finally:
        model.release()
    busy.cancel()
    with contextlib.suppress(asyncio.CancelledError, ShuttingDown):
        await busy


async def test_shutdown_drains_within_its_budget_and_refuses_the_rest(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, drain_timeout=0.05)
    service = client.app[SERVICE_KEY]
    async with holding(client, model, ["b [MASK]", "c [MASK]"]) as held:
        await drain_on_shutdown(client.app)
        assert service.lifecycle.draining and service.scheduler.closed
        assert [(await task).status for task in held.queued] == [503, 503]
    assert (await held.busy).status == 200


async def test_shutdown_with_nothing_queued_closes_the_door_at_once(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel())
    service = client.app[SERVICE_KEY]
    await drain_on_shutdown(client.app)
    assert service.lifecycle.draining and service.scheduler.closed
    assert (await client.post("/", data="a [MASK]")).status == 503


async def test_a_draining_server_asks_every_client_to_reconnect() -> None:
    app = create_app(Settings(warmup=False), engine=EchoModel())
    app[SERVICE_KEY].lifecycle.start_draining()
    response = web.Response()
    await close_connections_while_draining(make_mocked_request("GET", "/", app=app), response)
    assert response.headers["Connection"] == "close" and response.keep_alive is False


async def test_a_serving_server_leaves_the_connection_alone() -> None:
    app = create_app(Settings(warmup=False), engine=EchoModel())
    response = web.Response()
    await close_connections_while_draining(make_mocked_request("GET", "/", app=app), response)
    assert "Connection" not in response.headers and response.keep_alive is not False


def test_a_model_that_cannot_load_is_named_when_there_are_several() -> None:
    with pytest.raises(ModelLoadError, match=r"^model 'first': could not load model '/nonexistent/first'"):
        load_models(model_configs(Settings(model=("first=/nonexistent/first", "second=/nonexistent/second"))))


def test_a_server_of_one_model_reports_its_load_error_unchanged() -> None:
    with pytest.raises(ModelLoadError, match=r"^could not load model '/nonexistent/only'"):
        load_models(model_configs(Settings(model=("/nonexistent/only",))))
