"""observability/logs.py: the level from the settings, JSON lines, and one line per message whatever it holds
(the access line's own fields are tested in tests/unit/request/test_access_log.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.http.app import create_app
from maskserve.model_api import FillMaskModel
from maskserve.observability.logs import configure_logging
from maskserve.request.access_log import AccessLogger
from tests.fakes import ControlledModel

ACCESS_LOGGER = "maskserve.access"
Client = TestClient[web.Request, web.Application]


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


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    """configure_logging replaces the root logger's handlers: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root_logger")
async def test_json_logs_are_one_parseable_object_per_line(
    # capsys first: torn down after the server, whose shutdown still logs to the captured stderr.
    capsys: pytest.CaptureFixture[str],
    served: Callable[..., Any],
) -> None:
    configure_logging("info", json_lines=True)
    model = ControlledModel()
    model.fail_all = True  # the batcher logs the failure with its traceback
    client = await served(engine=model)
    response = await client.post("/", data="the [MASK] is red.", headers={"X-Request-Id": "req-json-1"})
    assert response.status == 500
    lines: list[dict[str, Any]] = []
    for _ in range(200):
        lines += [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        if any(entry.get("logger") == ACCESS_LOGGER for entry in lines):
            break
        await asyncio.sleep(0.01)
    access = [entry for entry in lines if entry["logger"] == ACCESS_LOGGER]
    assert len(access) == 1
    assert {k: access[0][k] for k in ("request_id", "method", "path", "status", "kind")} == {
        "request_id": "req-json-1",
        "method": "POST",
        "path": "/",
        "status": 500,
        "kind": "inference_failed",
    }
    assert isinstance(access[0]["latency_ms"], float)
    # A multi-line traceback still fits on its one line.
    failures = [entry for entry in lines if "exception" in entry]
    assert failures and "injected fault" in failures[0]["exception"]
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in lines)


@pytest.mark.usefixtures("restore_root_logger")
def test_log_level_comes_from_the_settings() -> None:
    configure_logging(Settings(log_level="warning").log_level, json_lines=False)
    assert logging.getLogger().level == logging.WARNING
    assert len(logging.getLogger().handlers) == 1


async def stderr_lines_until(capsys: pytest.CaptureFixture[str], needle: str) -> list[str]:
    """stderr's lines until one holds ``needle``: the access line comes after the response."""
    lines: list[str] = []
    for _ in range(200):
        lines += capsys.readouterr().err.splitlines()
        if any(needle in line for line in lines):
            return lines
        await asyncio.sleep(0.01)
    raise AssertionError(f"no log line holds {needle!r}: {lines}")


@pytest.mark.usefixtures("restore_root_logger")
@pytest.mark.parametrize("json_lines", [False, True], ids=["plain", "json"])
async def test_a_path_with_cr_lf_writes_one_log_line(
    capsys: pytest.CaptureFixture[str], served: Callable[..., Any], json_lines: bool
) -> None:
    configure_logging("info", json_lines=json_lines)
    client = await served()
    # Percent-encoded in the request line, as HTTP demands; aiohttp hands handlers the decoded
    # path, which holds a real CR LF and a line separator.
    forged = "/x%0D%0A2026-12-03 00:00:00,000 INFO maskserve.access: forged 200 ok%E2%80%A8more%7F"
    assert (await client.get(forged, headers={"X-Request-Id": "req-forge-1"})).status == 404
    lines = await stderr_lines_until(capsys, "req-forge-1")
    access = [line for line in lines if "req-forge-1" in line]
    assert len(access) == 1, lines
    assert not any(line.startswith("2026-12-03 00:00:00") or '"forged' in line for line in lines), lines
    if json_lines:
        assert json.loads(access[0])["path"].startswith("/x\\x0d\\x0a2026-12-03")
    else:
        assert "/x\\x0d\\x0a2026-12-03 00:00:00,000 INFO maskserve.access: forged 200 ok\\u2028more\\x7f" in access[0]
