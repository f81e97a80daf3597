"""request/access_log.py: the access line's fields, its kind when none was set, escaped control
characters, the trace id when traced; and the line as the real server writes it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.http.app import create_app
from maskserve.model_api import FillMaskModel
from maskserve.request.access_log import AccessLogger
from maskserve.request.keys import state_of
from tests.fakes import default_parts

ACCESS_LOGGER = "maskserve.access"
Client = TestClient[web.Request, web.Application]


def logged(
    caplog: pytest.LogCaptureFixture, request: web.Request, status: int = 200, seconds: float = 0.0125
) -> logging.LogRecord:
    """The one record AccessLogger writes for ``request`` answered ``status`` in ``seconds``."""
    logger = logging.getLogger(ACCESS_LOGGER)
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        AccessLogger(logger, "").log(request, web.Response(status=status), seconds)
    (record,) = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    return record


def test_the_line_names_id_method_path_status_kind_and_latency(caplog: pytest.LogCaptureFixture) -> None:
    request = make_mocked_request("POST", "/score")
    state_of(request).id = "req-1"
    record = logged(caplog, request, 200, 0.0125)
    assert record.getMessage() == "req-1 POST /score 200 ok 12.50ms"
    fields = ("request_id", "method", "path", "status", "kind", "latency_ms")
    assert {key: vars(record)[key] for key in fields} == dict(zip(fields, ("req-1", "POST", "/score", 200, "ok", 12.5)))


def test_an_error_without_a_kind_is_logged_with_a_dash(caplog: pytest.LogCaptureFixture) -> None:
    record = logged(caplog, make_mocked_request("GET", "/"), 404)
    assert record.getMessage().startswith("- GET / 404 - ")
    assert vars(record)["kind"] == "-"


def test_the_kind_the_request_was_answered_with_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    request = make_mocked_request("GET", "/readyz")
    state_of(request).kind = "not_ready"
    assert vars(logged(caplog, request, 503))["kind"] == "not_ready"


def test_control_characters_in_the_path_are_escaped_in_the_line_and_its_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Percent-encoded in the request line; the decoded path holds a real CR LF and a line separator.
    record = logged(caplog, make_mocked_request("GET", "/x%0D%0Aforged%E2%80%A8more%7F"), 404)
    assert vars(record)["path"] == "/x\\x0d\\x0aforged\\u2028more\\x7f"
    assert "\r" not in record.getMessage() and "\n" not in record.getMessage()
    assert "/x\\x0d\\x0aforged\\u2028more\\x7f" in record.getMessage()


def test_a_traced_request_ends_its_line_with_the_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    request = make_mocked_request("POST", "/")
    state_of(request).trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    record = logged(caplog, request)
    assert record.getMessage().endswith(" trace_id=4bf92f3577b34da6a3ce929d0e0e4736")
    assert vars(record)["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_an_untraced_request_has_no_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    record = logged(caplog, make_mocked_request("POST", "/"))
    assert "trace_id" not in record.getMessage() and not hasattr(record, "trace_id")


@pytest.fixture
async def served(aiohttp_client: Any, bert_engine: FillMaskEngine) -> Callable[..., Any]:
    """A client of ``create_app`` served as ``maskserve`` serves it: with our access logger."""

    async def make(engine: FillMaskModel | None = None) -> Client:
        app = create_app(Settings(), engine=engine if engine is not None else bert_engine)
        # Started here: aiohttp's TestServer drops runner options given to its constructor
        # (server_kwargs) and only honours those given to start_server.
        server = TestServer(app)
        await server.start_server(access_log_class=AccessLogger, access_log=logging.getLogger(ACCESS_LOGGER))
        client: Client = await aiohttp_client(server)
        return client

    return make


def access_fields(record: logging.LogRecord) -> tuple[str, int, str]:
    """(request id, status, kind): the extra fields the access logger puts on its record."""
    extra = vars(record)
    return extra["request_id"], extra["status"], extra["kind"]


async def access_records(caplog: pytest.LogCaptureFixture, count: int) -> list[logging.LogRecord]:
    """The access lines so far, once there are ``count``: aiohttp logs just after the response."""
    for _ in range(200):
        records = [r for r in caplog.records if r.name == ACCESS_LOGGER]
        if len(records) >= count:
            return records
        await asyncio.sleep(0.01)
    raise AssertionError(f"expected {count} access lines, got {len(records)}")


async def test_access_line_names_request_id_status_kind_and_latency(
    served: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    client = await served()
    ok = await client.post("/", data="the [MASK] is red.", headers={"X-Request-Id": "req-ok-1"})
    assert ok.status == 200
    bad = await client.post("/", data="no mask here")
    assert bad.status == 422
    ok_line, bad_line = await access_records(caplog, 2)

    assert ok_line.getMessage().startswith("req-ok-1 POST / 200 ok ")
    assert access_fields(ok_line) == ("req-ok-1", 200, "ok")
    assert vars(ok_line)["latency_ms"] >= 0
    generated_id = bad.headers["X-Request-Id"]
    assert access_fields(bad_line) == (generated_id, 422, "no_mask_token")
    assert generated_id in bad_line.getMessage()


async def test_failed_probe_is_logged_with_its_kind(
    served: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    client = await served()
    default_parts(client).batcher.close()  # draining: not ready
    assert (await client.get("/readyz")).status == 503
    (line,) = await access_records(caplog, 1)
    assert access_fields(line)[1:] == (503, "not_ready")
