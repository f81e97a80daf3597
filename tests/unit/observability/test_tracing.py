"""observability/tracing.py, with the SDK's in-memory exporter: the exporters by name, the provider's
service name, a forward pass's batch span and its links, a request's child spans, its trace id."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from maskserve import __version__
from maskserve.observability.tracing import Tracing, exporter_factories, trace_id, tracer_provider
from maskserve.serving.costs import BatchReport
from maskserve.serving.work_queue import Answer
from tests.fakes import EchoModel

SECOND_NS = 1_000_000_000
START_NS = 1_700_000_000 * SECOND_NS


@pytest.fixture
def memory() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(memory: InMemorySpanExporter) -> Iterator[Tracing]:
    tracing = Tracing(tracer_provider([memory]))
    yield tracing
    tracing.shutdown()


def exported(tracing: Tracing, memory: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The spans finished so far, by name (each name once)."""
    tracing.provider.force_flush()
    spans = {span.name: span for span in memory.get_finished_spans()}
    assert len(spans) == len(memory.get_finished_spans()), "a span name came twice"
    return spans


def test_no_exporter_is_asked_for_with_none() -> None:
    assert exporter_factories("none") == []


def test_an_exporter_is_found_by_its_entry_point_name() -> None:
    (factory,) = exporter_factories("console")
    assert factory is ConsoleSpanExporter


def test_otlp_is_the_default_and_names_the_http_exporter() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    assert exporter_factories(None) == exporter_factories("otlp") == [OTLPSpanExporter]


def test_several_exporters_are_separated_by_commas() -> None:
    assert len(exporter_factories("console,none,otlp")) == 2


def test_an_unknown_exporter_is_refused_naming_the_installed_ones() -> None:
    with pytest.raises(ValueError, match=r"^no span exporter named 'zipkin2' is installed \(installed: (.*)\)$") as e:
        exporter_factories("console,zipkin2")
    installed = str(e.value).split("installed: ")[1].rstrip(")").split(", ")
    assert {"console", "otlp", "otlp_proto_http"} <= set(installed)


def test_the_provider_names_the_service_maskserve_and_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = tracer_provider([])
    assert provider.resource.attributes[SERVICE_NAME] == "maskserve"
    assert provider.resource.attributes[SERVICE_VERSION] == __version__
    provider.shutdown()


def test_the_service_name_from_the_environment_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fill-mask-eu")
    provider = tracer_provider([])
    assert provider.resource.attributes[SERVICE_NAME] == "fill-mask-eu"
    provider.shutdown()


def test_shutting_down_exports_what_is_left(memory: InMemorySpanExporter) -> None:
    tracing = Tracing(tracer_provider([memory]))
    tracing.tracer.start_span("POST /").end()
    tracing.shutdown()
    assert [span.name for span in memory.get_finished_spans()] == ["POST /"]


def batch_report(contexts: tuple[object, ...], failed: int = 0) -> BatchReport:
    return BatchReport(
        size=3,
        real_tokens=12,
        padded_tokens=15,
        seconds=0.25,
        failed=failed,
        started_ns=START_NS,
        number=7,
        contexts=contexts,
    )


def test_a_forward_pass_is_one_root_span_linked_to_the_requests_it_served(
    tracing: Tracing, memory: InMemorySpanExporter
) -> None:
    requests = [tracing.tracer.start_span(f"request {n}") for n in range(2)]
    contexts = tuple(span.get_span_context() for span in requests)
    # Texts of untraced requests carry no span context: they are served, but nothing links them.
    tracing.observe(EchoModel(), "served-name")(batch_report((*contexts, None, "not a context")))
    batch = exported(tracing, memory)["maskserve.batch"]
    assert batch.parent is None
    assert [link.context for link in batch.links] == list(contexts)
    assert (batch.start_time, batch.end_time) == (START_NS, START_NS + SECOND_NS // 4)
    assert batch.attributes is not None and dict(batch.attributes) == {
        "maskserve.model": "served-name",
        "maskserve.model.source": "echo",
        "maskserve.device": "unknown",
        "maskserve.batch.number": 7,
        "maskserve.batch.size": 3,
        "maskserve.batch.requests": 2,
        "maskserve.batch.padded_tokens": 15,
        "maskserve.batch.real_tokens": 12,
        "maskserve.batch.failed": 0,
    }
    assert batch.status.is_unset


class DescribedEcho(EchoModel):
    def describe(self) -> dict[str, str | int | float]:
        return {"source": "org/tiny-bert", "device": "cpu"}


def test_the_batch_span_names_the_models_source_and_device(tracing: Tracing, memory: InMemorySpanExporter) -> None:
    tracing.observe(DescribedEcho())(batch_report(()))
    attributes = exported(tracing, memory)["maskserve.batch"].attributes
    assert attributes is not None
    assert (attributes["maskserve.model"], attributes["maskserve.model.source"]) == ("echo", "org/tiny-bert")
    assert attributes["maskserve.device"] == "cpu"


def test_a_pass_that_failed_is_an_error_span_saying_on_how_many_inputs(
    tracing: Tracing, memory: InMemorySpanExporter
) -> None:
    tracing.observe(EchoModel())(batch_report((), failed=2))
    status = exported(tracing, memory)["maskserve.batch"].status
    assert status.status_code is trace.StatusCode.ERROR
    assert status.description == "the model failed on 2 input(s)"


def test_a_request_links_its_texts_by_its_own_span(tracing: Tracing) -> None:
    span = tracing.tracer.start_span("POST /")
    assert tracing.request_trace(span).link == span.get_span_context()
    span.end()


def test_a_step_is_a_child_of_the_request_span(tracing: Tracing, memory: InMemorySpanExporter) -> None:
    span = tracing.tracer.start_span("POST /")
    with tracing.request_trace(span).step("maskserve.parse"):
        pass
    span.end()
    spans = exported(tracing, memory)
    parse, http = spans["maskserve.parse"], spans["POST /"]
    assert parse.parent is not None and http.context is not None
    assert parse.parent.span_id == http.context.span_id


def answer(batch_number: int, started_ns: int, inference_s: float, batch_size: int) -> Answer:
    return Answer(
        predictions=[],
        queued_s=0.0,
        inference_s=inference_s,
        batch_size=batch_size,
        started_ns=started_ns,
        batch_number=batch_number,
    )


def test_served_texts_get_a_queue_span_and_one_span_per_forward_pass(
    tracing: Tracing, memory: InMemorySpanExporter
) -> None:
    span = tracing.tracer.start_span("POST /")
    first, second = START_NS + SECOND_NS, START_NS + 2 * SECOND_NS
    # Three texts: two shared pass 4, the third ran in pass 5.
    answers = [answer(4, first, 0.5, 8), answer(5, second, 0.25, 2), answer(4, first, 0.5, 8)]
    tracing.request_trace(span).served(answers, START_NS)
    span.end()
    tracing.provider.force_flush()
    finished = memory.get_finished_spans()
    (queue,) = [s for s in finished if s.name == "maskserve.queue"]
    assert (queue.start_time, queue.end_time) == (START_NS, first)
    assert queue.attributes is not None and queue.attributes["maskserve.texts"] == 3
    passes = sorted((s for s in finished if s.name == "maskserve.inference"), key=lambda s: s.start_time or 0)
    assert [(s.start_time, s.end_time) for s in passes] == [
        (first, first + SECOND_NS // 2),
        (second, second + SECOND_NS // 4),
    ]
    assert [dict(s.attributes or {}) for s in passes] == [
        {"maskserve.batch.number": 4, "maskserve.batch.size": 8},
        {"maskserve.batch.number": 5, "maskserve.batch.size": 2},
    ]
    http = next(s for s in finished if s.name == "POST /")
    assert http.context is not None
    assert all(s.parent is not None and s.parent.span_id == http.context.span_id for s in [queue, *passes])


def test_a_pass_started_before_the_request_queued_ends_its_queue_span_where_it_starts(
    tracing: Tracing, memory: InMemorySpanExporter
) -> None:
    span = tracing.tracer.start_span("POST /")
    tracing.request_trace(span).served([answer(1, START_NS - 10, 0.0, 1)], START_NS)
    span.end()
    queue = exported(tracing, memory)["maskserve.queue"]
    assert queue.start_time == queue.end_time == START_NS


def test_a_span_gives_its_trace_id_as_32_hex_digits(tracing: Tracing) -> None:
    span = tracing.tracer.start_span("POST /")
    context = span.get_span_context()
    assert trace_id(span) == format(context.trace_id, "032x")
    span.end()


def test_a_span_without_a_valid_context_has_no_trace_id() -> None:
    assert trace_id(trace.INVALID_SPAN) is None
