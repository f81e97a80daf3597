"""OpenTelemetry tracing (``maskserve[otel]``): the tracer provider, each request's spans, the batch spans.

No HTTP here: the HTTP server span, and the aiohttp instrumentation that opens it, are the
tracing stage's (``middleware/request_tracing.py``).

A request's trace, under the HTTP server span that ``opentelemetry-instrumentation-aiohttp-server``
opens (continuing an incoming W3C ``traceparent``)::

    POST /                      the HTTP span: route, status; error.type and the refusal reason
    ├── maskserve.parse         reading the body, validating it, tokenizing
    ├── maskserve.queue         from queueing its texts to the start of their forward pass
    └── maskserve.inference     the forward pass that served them (batch number and size)

A forward pass serves many requests, so it is recorded once, as a ``maskserve.batch`` span of its
own trace, *linked* to the HTTP span of every request it served, with its size, padded and real
tokens, the device and the model as attributes. Every span is built from times the batcher
measured, after the fact: the inference thread never touches OpenTelemetry.

The provider follows OpenTelemetry's standard variables (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_ENDPOINT``...); the exporters are
``--traces-exporter`` / ``OTEL_TRACES_EXPORTER`` (see config/settings.py). This module imports the
OpenTelemetry SDK, so only the tracing stage imports it, and only when tracing is on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from importlib.metadata import entry_points

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from maskserve import __version__
from maskserve.model_api import FillMaskModel, describe_model
from maskserve.serving.costs import BatchReport
from maskserve.serving.work_queue import Answer

EXPORTER_GROUP = "opentelemetry_traces_exporter"
# OpenTelemetry's own name for OTLP. maskserve[otel] installs the HTTP/protobuf exporter (port
# 4318), which needs no gRPC runtime; OTLP over gRPC is "otlp_proto_grpc" once its package is in.
ALIASES = {"otlp": "otlp_proto_http"}
# What tracing exports when the stage is added (--middleware default,+tracing) with no exporter
# named: OpenTelemetry's own default.
DEFAULT_EXPORTERS = "otlp"

ExporterFactory = Callable[[], SpanExporter]


def exporter_factories(names: str | None) -> list[ExporterFactory]:
    """The span exporters ``names`` asks for (comma-separated; ``none``: no exporter).

    Raises ValueError naming an exporter that is not installed, and the ones that are.
    """
    wanted = [name for name in (names or DEFAULT_EXPORTERS).split(",") if name and name != "none"]
    installed = {entry.name: entry for entry in entry_points(group=EXPORTER_GROUP)}
    factories: list[ExporterFactory] = []
    for name in wanted:
        entry = installed.get(ALIASES.get(name, name))
        if entry is None:
            known = ", ".join(sorted({*installed, *(a for a, target in ALIASES.items() if target in installed)}))
            raise ValueError(f"no span exporter named {name!r} is installed (installed: {known or 'none'})")
        factories.append(entry.load())
    return factories


def tracer_provider(exporters: Sequence[SpanExporter]) -> TracerProvider:
    """A provider exporting to ``exporters`` in the background, named "maskserve" unless
    ``OTEL_SERVICE_NAME`` (or ``OTEL_RESOURCE_ATTRIBUTES``) says otherwise."""
    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "maskserve"}))
    # The app shuts it down at clean-up (flushing what is left), not an atexit hook: several apps
    # may live in one process, as in the tests.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for exporter in exporters:
        # Batched off the event loop: ending a span only queues it.
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class Tracing:
    """One app's tracing: its provider, request traces and batch spans."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("maskserve", __version__)

    def observe(self, model: FillMaskModel, name: str | None = None) -> Callable[[BatchReport], None]:
        """The batcher listener for ``model``'s forward passes; ``name`` is the one clients use."""
        description = describe_model(model)
        attributes = {
            "maskserve.model": name or model.name,
            "maskserve.model.source": str(description.get("source", model.name)),
            "maskserve.device": str(description.get("device", "unknown")),
        }
        return lambda report: self.observe_batch(report, attributes)

    def request_trace(self, span: trace.Span) -> OtelRequestTrace:
        return OtelRequestTrace(self.tracer, span)

    def observe_batch(self, report: BatchReport, attributes: dict[str, str]) -> None:
        """Batcher listener: one ``maskserve.batch`` span per forward pass, linked to its requests."""
        links = [trace.Link(ctx) for ctx in report.contexts if isinstance(ctx, trace.SpanContext)]
        span = self.tracer.start_span(
            "maskserve.batch",
            # A root span: a pass belongs to no one request's trace; the links say whom it served.
            context=otel_context.Context(),
            links=links,
            start_time=report.started_ns,
            attributes={
                **attributes,
                "maskserve.batch.number": report.number,
                "maskserve.batch.size": report.size,
                "maskserve.batch.requests": len(links),
                "maskserve.batch.padded_tokens": report.padded_tokens,
                "maskserve.batch.real_tokens": report.real_tokens,
                "maskserve.batch.failed": report.failed,
            },
        )
        if report.failed:
            span.set_status(trace.StatusCode.ERROR, f"the model failed on {report.failed} input(s)")
        span.end(end_time=report.started_ns + round(report.seconds * 1e9))

    def shutdown(self) -> None:
        """Export what is left and stop the exporters' threads."""
        self.provider.shutdown()


class OtelRequestTrace:
    """:class:`maskserve.observability.request_trace.RequestTrace` on OpenTelemetry: child spans of the HTTP span."""

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self._span = span
        self._parent = trace.set_span_in_context(span)

    @property
    def link(self) -> object:
        return self._span.get_span_context()

    def step(self, name: str) -> AbstractContextManager[object]:
        return self._tracer.start_as_current_span(name, context=self._parent)

    def served(self, answers: Sequence[Answer], queued_ns: int) -> None:
        passes = {answer.batch_number: answer for answer in answers}
        first_pass = min(answer.started_ns for answer in answers)
        self._span_between("maskserve.queue", queued_ns, first_pass, {"maskserve.texts": len(answers)})
        for number, answer in sorted(passes.items()):
            attributes = {"maskserve.batch.number": number, "maskserve.batch.size": answer.batch_size}
            end = answer.started_ns + round(answer.inference_s * 1e9)
            self._span_between("maskserve.inference", answer.started_ns, end, attributes)

    def _span_between(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, str | int]) -> None:
        span = self._tracer.start_span(name, context=self._parent, start_time=start_ns, attributes=attributes)
        span.end(end_time=max(start_ns, end_ns))


def trace_id(span: trace.Span) -> str | None:
    """The span's trace id as 32 hex digits (as in ``traceparent``), or None when it has none."""
    context = span.get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None
