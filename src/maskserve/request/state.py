"""One request's own record: what the stages and its handler learn about it, in one place.

The error stage gives it its id; the deadline is fixed once, at the door; the tracing stage hands
it a trace; the handler keeps how its texts were served; whoever answers it with an error says
which. The access log and the metrics read it last. Plain data, no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from maskserve.errors import MaskserveError
from maskserve.observability.request_trace import NO_TRACE, RequestTrace
from maskserve.service.served_model import ServedModel
from maskserve.serving.work_queue import Answer


@dataclass
class RequestState:
    """What one request carries through the middleware and its handler."""

    # Its id: the caller's X-Request-Id when plain, else a new one (the error stage sets it).
    id: str = "-"
    # Its deadline on the event loop's clock, once computed (deadlines.request_deadline).
    deadline: float | None = None
    # The kind it was answered with when that was not a success: an error's kind, or a failed
    # probe's (not_live, not_ready); for the access log, the metrics and the trace.
    kind: str | None = None
    # The error it was answered with, for the tracing stage (its kind and a refusal's reason).
    error: MaskserveError | None = None
    # Its trace (the tracing stage's when tracing is on), and the trace id for the access log.
    trace: RequestTrace = NO_TRACE
    trace_id: str | None = None
    # The served model its route (or a page's form) named, resolved once (run_task.served_model):
    # the door admits on it and the handler answers with it.
    served: ServedModel | None = None
    # That model once held (run_task.held_model): from before its body is read to its answer.
    held: ServedModel | None = None
    # That model's name; "" for routes that name none and for unknown names, so that the metrics'
    # model label stays the served names.
    model: str = ""
    # How each of its texts was served, for the queue-wait metric.
    answers: list[Answer] = field(default_factory=list)
    # How many windows each of its texts was read in (1: read whole), for the windows metric.
    windows: tuple[int, ...] = ()
    # Why its connection must close once its answer is written (body_timeout), if it must.
    close_after: str | None = None
