"""The tracing stage (``maskserve[otel]``): each request in an OpenTelemetry trace.

Off unless ``--traces-exporter`` / ``OTEL_TRACES_EXPORTER`` names an exporter, or ``--middleware``
adds it (``default,+tracing``). The HTTP server span is opened by
``opentelemetry-instrumentation-aiohttp-server``'s middleware, which continues an incoming W3C
``traceparent``; inside it this stage hands the handlers their
:class:`~maskserve.observability.request_trace.RequestTrace` (on the request's record), keeps the
trace id for the access log, and marks an error's kind and a refusal's reason on the span. It sits
outermost, outside the error sanitizer: it sees every response as the client got it, and it raises nothing of its own.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from opentelemetry import trace
from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor, create_aiohttp_middleware

from maskserve.observability.tracing import ExporterFactory, Tracing, trace_id, tracer_provider
from maskserve.request.keys import service_of, state_of


@dataclass(frozen=True)
class AppTracing:
    """The stage's state on one app: its tracing, and the middleware that opens the HTTP spans."""

    tracing: Tracing
    # Opens the HTTP server span of each request, continuing an incoming traceparent.
    http_spans: Middleware

    @classmethod
    def start(cls, exporters: Sequence[ExporterFactory]) -> AppTracing:
        provider = tracer_provider([make() for make in exporters])
        _initialise_instrumentation()
        return cls(Tracing(provider), create_aiohttp_middleware(tracer_provider=provider))


# The stage's own state on the app. Declared here rather than in keys.py, which must import without
# the OpenTelemetry SDK (an extra); nothing outside this stage reads it.
TRACING_KEY = web.AppKey("tracing", AppTracing)


def _initialise_instrumentation() -> None:
    """Set up the instrumentation package's module state (its URL exclusions, its meters) without
    leaving its patch of ``web.Application`` in place: maskserve puts its middleware in the chain."""
    instrumentor = AioHttpServerInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        with warnings.catch_warnings():
            # instrument() subclasses web.Application for its patch, which aiohttp discourages with
            # a DeprecationWarning; the patch is undone on the next line and never used.
            warnings.simplefilter("ignore", DeprecationWarning)
            instrumentor.instrument()
        instrumentor.uninstrument()


def tracing_middleware(exporters: Sequence[ExporterFactory]) -> Middleware:
    """The stage; its ``setup_app`` starts the tracer provider with the app and flushes it at the end."""

    @web.middleware
    async def tracing(request: web.Request, handler: Handler) -> web.StreamResponse:
        state = request.app.get(TRACING_KEY)
        if state is None:  # the app has not started: nothing to trace into
            return await handler(request)

        async def traced(request: web.Request) -> web.StreamResponse:
            span = trace.get_current_span()
            record = state_of(request)
            record.trace = state.tracing.request_trace(span)
            record.trace_id = trace_id(span)
            response = await handler(request)
            if record.model and span.is_recording():  # the served model the route named
                span.set_attribute("maskserve.model", record.model)
            error = record.error
            if error is not None and span.is_recording():
                span.set_attribute("error.type", error.kind)
                reason = getattr(error, "reason", None)
                if reason is not None:
                    span.set_attribute("maskserve.refusal.reason", str(reason))
            return response

        return await state.http_spans(request, traced)

    def setup_app(app: web.Application) -> None:
        # create_app calls this before it adds the inference context, so the provider outlives
        # the drain: the spans of requests answered while stopping are still exported.
        app.cleanup_ctx.append(_tracing_context(exporters))
        app.on_startup.append(_observe_batches)

    tracing.setup_app = setup_app  # type: ignore[attr-defined]
    return tracing


def _tracing_context(
    exporters: Sequence[ExporterFactory],
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def context(app: web.Application) -> AsyncIterator[None]:
        app[TRACING_KEY] = AppTracing.start(exporters)
        try:
            yield
        finally:
            app[TRACING_KEY].tracing.shutdown()

    return context


async def _observe_batches(app: web.Application) -> None:
    # on_startup runs after every cleanup context has started, so the batchers exist by now.
    for served in service_of(app).models.values():
        batcher = served.loaded.batcher
        batcher.listeners.append(app[TRACING_KEY].tracing.observe(batcher.model, served.name))
