"""Each RPC in an OpenTelemetry trace (``maskserve[otel]``, when the tracing stage is on): a server
span per call, continuing the ``traceparent`` in its metadata, with the RPC's attributes and, as the
HTTP stage does, the model and an error's kind; the request's steps and batches hang from it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import propagate, trace

from maskserve.observability.tracing import Tracing, trace_id
from maskserve.request.state import RequestState
from maskserve.rpc.protocol import SERVICE
from maskserve.rpc.status import status_code


class RpcSpans:
    """The :class:`~maskserve.rpc.calls.CallSpans` of an app's tracing."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    @contextlib.contextmanager
    def span(self, method: str, metadata: Sequence[tuple[str, Any]], state: RequestState) -> Iterator[Any]:
        carrier = {key: value for key, value in metadata if isinstance(value, str)}
        with self.tracing.tracer.start_as_current_span(
            f"{SERVICE}/{method}",
            context=propagate.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method},
        ) as span:
            state.trace = self.tracing.request_trace(span)
            state.trace_id = trace_id(span)
            yield span
            if not span.is_recording():
                return
            if state.model:
                span.set_attribute("maskserve.model", state.model)
            error = state.error
            code = status_code(error).value[0] if error is not None else 0
            span.set_attribute("rpc.grpc.status_code", code)
            if error is not None:
                span.set_attribute("error.type", error.kind)
                reason = getattr(error, "reason", None)
                if reason is not None:
                    span.set_attribute("maskserve.refusal.reason", str(reason))
                if code == 13 or error.status >= 500:  # a server-side failure marks the span as failed
                    span.set_status(trace.Status(trace.StatusCode.ERROR, error.kind))
