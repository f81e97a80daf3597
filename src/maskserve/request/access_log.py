"""The access line: one per request, errors included, with its id, kind and latency; HTTP's and gRPC's alike."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from maskserve.observability.logs import escape_control
from maskserve.request.keys import state_of
from maskserve.request.state import RequestState


class AccessLogger(AbstractAccessLogger):
    """``request_id method path status kind latency`` for every request, errors included, and
    ``trace_id=...`` when the request was traced (the tracing stage is on)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        write_access_line(self.logger, state_of(request), request.method, request.path, response.status, time)


def write_access_line(
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    state: RequestState,
    method: str,
    path: str,
    status: int,
    seconds: float,
) -> None:
    """``request_id method path status kind latency`` (and ``trace_id=...`` when traced); a gRPC call
    is method ``GRPC``, its path the RPC's, its status the HTTP status its gRPC status stands for."""
    request_id = state.id
    kind = state.kind or ("ok" if status < 400 else "-")
    latency_ms = round(seconds * 1000, 2)
    # Escaped here too, not only by the formatter: the fields also reach any handler an
    # embedding application installs, as structured extras.
    path = escape_control(path)
    extra: dict[str, Any] = {
        "request_id": request_id,
        "method": method,
        "path": path,
        "status": status,
        "kind": kind,
        "latency_ms": latency_ms,
    }
    line = "%s %s %s %d %s %.2fms"
    args: list[Any] = [request_id, method, path, status, kind, latency_ms]
    trace_id = state.trace_id
    if trace_id is not None:
        extra["trace_id"] = trace_id
        line += " trace_id=%s"
        args.append(trace_id)
    logger.info(line, *args, extra=extra)
