"""The tracing stage with the OpenTelemetry SDK's in-memory exporter: continued traces, the span
tree of a request, the batch span linked to every request it served, refusals, the access log."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import maskserve.observability.tracing
from maskserve.config.flags import load_settings
from maskserve.config.settings import Settings, SettingsError
from maskserve.http.app import SETTINGS_CHECKS, create_app
from maskserve.middleware.chain import check_tracing
from maskserve.middleware.request_tracing import TRACING_KEY
from maskserve.model_api import FillMaskModel
from maskserve.request.access_log import AccessLogger
from tests.fakes import ControlledModel, default_parts, wait_for_depth, wait_until_entered
from tests.live_server import maskserve_process

Client = TestClient[web.Request, web.Application]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
PARIS = "Paris is the [MASK] of France."


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Every app started in the test exports its spans here instead of to the named exporters."""
    memory = InMemorySpanExporter()
    monkeypatch.setattr(maskserve.observability.tracing, "exporter_factories", lambda names: [lambda: memory])
    return memory


@pytest.fixture
def traced(aiohttp_client: Any, exporter: InMemorySpanExporter) -> Callable[..., Any]:
    """A client of ``create_app`` with tracing on, served with maskserve's access logger."""

    async def make(engine: FillMaskModel, **settings: Any) -> Client:
        app = create_app(Settings(traces_exporter="console", **{"warmup": False, **settings}), engine=engine)
        server = TestServer(app)
        # TestServer turns handler cancellation on, as maskserve does.
        await server.start_server(access_log_class=AccessLogger, access_log=logging.getLogger("maskserve.access"))
        client: Client = await aiohttp_client(server)
        return client

    return make


def finished(client: Client, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    client.app[TRACING_KEY].tracing.provider.force_flush()
    return list(exporter.get_finished_spans())


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def test_a_traceparent_is_continued_and_the_request_has_parse_queue_and_inference_spans(
    traced: Callable[..., Any], exporter: InMemorySpanExporter
) -> None:
    client = await traced(ControlledModel())
    response = await client.post("/", data=PARIS, headers={"traceparent": TRACEPARENT})
    assert response.status == 200
    spans = finished(client, exporter)
    (http,) = [span for span in spans if span.kind is SpanKind.SERVER]
    assert http.context is not None and http.parent is not None
    assert format(http.context.trace_id, "032x") == TRACE_ID  # the caller's trace, continued
    assert format(http.parent.span_id, "016x") == PARENT_ID
    assert http.attributes is not None and http.attributes.get("http.status_code", 200) == 200
    assert http.attributes["maskserve.model"] == "maskserve"  # the served model the route named
    children = {
        span.name: span for span in spans if span.parent is not None and span.parent.span_id == http.context.span_id
    }
    assert set(children) == {"maskserve.parse", "maskserve.queue", "maskserve.inference"}
    parse, queue, inference = children["maskserve.parse"], children["maskserve.queue"], children["maskserve.inference"]
    assert parse.end_time is not None and queue.start_time is not None and queue.end_time is not None
    assert parse.end_time <= queue.start_time <= queue.end_time  # parsed, then queued, then computed
    assert inference.start_time == queue.end_time
    assert inference.attributes is not None and inference.attributes["maskserve.batch.size"] == 1


async def test_one_batch_span_for_a_forward_pass_linked_to_every_request_it_served(
    traced: Callable[..., Any], exporter: InMemorySpanExporter
) -> None:
    model = ControlledModel()
    client = await traced(model)
    model.hold()
    first = asyncio.create_task(client.post("/", data="first [MASK]"))
    await wait_until_entered(model)
    together = [asyncio.create_task(client.post("/", data=f"t{n} [MASK] word")) for n in range(3)]
    await wait_for_depth(default_parts(client).batcher, 3)
    model.release()
    assert [r.status for r in await asyncio.gather(first, *together)] == [200] * 4
    spans = finished(client, exporter)
    assert model.batch_sizes() == [1, 3]
    batches = named(spans, "maskserve.batch")
    assert len(batches) == 2  # one span per forward pass, not per request
    shared = next(span for span in batches if span.attributes and span.attributes["maskserve.batch.size"] == 3)
    assert shared.parent is None  # a root span of its own trace
    assert shared.attributes is not None
    assert shared.attributes["maskserve.batch.padded_tokens"] == 3 * 5  # [CLS] tN [MASK] word [SEP], 3 texts
    assert shared.attributes["maskserve.device"] == "unknown"  # the echo model does not say
    assert shared.attributes["maskserve.model"] == "maskserve"  # the name clients use (--model-name)
    assert shared.attributes["maskserve.model.source"] == "echo"  # what was loaded
    http_ids = {span.context.span_id for span in spans if span.kind is SpanKind.SERVER and span.context}
    linked = {link.context.span_id for link in shared.links}
    assert len(http_ids) == 4 and len(linked) == 3 and linked < http_ids  # the three it served
    (alone,) = [span for span in batches if span is not shared]
    assert {link.context.span_id for link in alone.links} == http_ids - linked  # and the first one
    # Each request's inference span names the pass it shared.
    numbers = {
        span.attributes["maskserve.batch.number"] for span in named(spans, "maskserve.inference") if span.attributes
    }
    assert numbers == {1, 2}


async def test_a_refused_request_carries_the_reason_on_its_span(
    traced: Callable[..., Any], exporter: InMemorySpanExporter
) -> None:
    model = ControlledModel()
    client = await traced(model, max_queue=2)
    model.hold()
    busy = asyncio.create_task(client.post("/", data=PARIS))
    await wait_until_entered(model)
    late = asyncio.create_task(client.post("/", data=PARIS, headers={"X-Request-Timeout": "0.3"}))
    queued = asyncio.create_task(client.post("/", data=PARIS))
    await wait_for_depth(default_parts(client).batcher, 2)
    refused = await client.post("/", data=PARIS)  # the queue is full
    assert (refused.status, (await late).status) == (503, 504)  # and the queued one ran out of time
    model.release()
    await busy
    await queued
    http = {
        span.attributes["error.type"]: span
        for span in finished(client, exporter)
        if span.kind is SpanKind.SERVER and span.attributes and "error.type" in span.attributes
    }
    assert set(http) == {"overloaded", "timeout"}
    assert http["overloaded"].attributes is not None
    assert http["overloaded"].attributes["maskserve.refusal.reason"] == "queue_full"
    assert http["overloaded"].status.is_ok is False


async def test_the_access_line_carries_the_trace_id(
    traced: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client = await traced(ControlledModel())
    with caplog.at_level(logging.INFO, logger="maskserve.access"):
        assert (await client.post("/", data=PARIS, headers={"traceparent": TRACEPARENT})).status == 200
        await asyncio.sleep(0.05)  # the access line is written after the response is sent
    (line,) = [r for r in caplog.records if r.name == "maskserve.access"]
    assert line.getMessage().endswith(f"trace_id={TRACE_ID}")
    assert vars(line)["trace_id"] == TRACE_ID


async def test_tracing_is_off_by_default_and_adds_nothing(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(Settings(), engine=ControlledModel())
    server = TestServer(app)
    await server.start_server(access_log_class=AccessLogger, access_log=logging.getLogger("maskserve.access"))
    client: Client = await aiohttp_client(server)
    assert TRACING_KEY not in client.app
    with caplog.at_level(logging.INFO, logger="maskserve.access"):
        assert (await client.post("/", data=PARIS, headers={"traceparent": TRACEPARENT})).status == 200
        await asyncio.sleep(0.05)
    assert "trace_id" not in caplog.text


def test_an_unknown_exporter_stops_start_up_naming_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"^OTEL_TRACES_EXPORTER: .*no span exporter named 'zipkin2'"):
        load_settings([], env={"OTEL_TRACES_EXPORTER": "zipkin2"}, checks=SETTINGS_CHECKS)
    assert load_settings([], env={"OTEL_TRACES_EXPORTER": "none"}, checks=SETTINGS_CHECKS).traces_exporter == "none"


def test_without_the_sdk_tracing_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in [
        m
        for m in sys.modules
        if m == "maskserve.observability.tracing" or m.startswith("maskserve.middleware.request_tracing")
    ]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # makes `import opentelemetry` fail
    with pytest.raises(ValueError, match=r"pip install 'maskserve\[otel\]'"):
        check_tracing(Settings(traces_exporter="otlp"))


@pytest.mark.slow
async def test_the_console_exporter_prints_the_callers_trace_id(tmp_path: Path) -> None:
    """End to end: ``OTEL_TRACES_EXPORTER=console python -m maskserve``, a request with a
    traceparent, then SIGTERM: the spans printed on the way out carry the caller's trace id."""
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "maskserve-e2e"}
    with maskserve_process("--torch-threads", "1", log_dir=tmp_path, env=env) as server:
        async with (
            aiohttp.ClientSession() as session,
            session.post(server.url + "/", data=PARIS, headers={"traceparent": TRACEPARENT}) as response,
        ):
            assert response.status == 200
        exit_code = await asyncio.to_thread(server.stop)
        text = server.log()
    assert exit_code == 0, text
    assert f'"trace_id": "0x{TRACE_ID}"' in text  # the HTTP span and its children, printed as JSON
    assert '"name": "maskserve.batch"' in text and '"service.name": "maskserve-e2e"' in text
    assert f"trace_id={TRACE_ID}" in text  # and the access line
