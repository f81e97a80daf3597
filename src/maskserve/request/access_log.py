"""The access line: one per request, errors included, with its id, kind and latency."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from maskserve.observability.logs import escape_control
from maskserve.request.keys import state_of


class AccessLogger(AbstractAccessLogger):
    """``request_id method path status kind latency`` for every request, errors included, and
    ``trace_id=...`` when the request was traced (the tracing stage is on)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        state = state_of(request)
        request_id = state.id
        kind = state.kind or ("ok" if response.status < 400 else "-")
        latency_ms = round(time * 1000, 2)
        # Escaped here too, not only by the formatter: the fields also reach any handler an
        # embedding application installs, as structured extras.
        path = escape_control(request.path)
        extra: dict[str, Any] = {
            "request_id": request_id,
            "method": request.method,
            "path": path,
            "status": response.status,
            "kind": kind,
            "latency_ms": latency_ms,
        }
        line = "%s %s %s %d %s %.2fms"
        args: list[Any] = [request_id, request.method, path, response.status, kind, latency_ms]
        trace_id = state.trace_id
        if trace_id is not None:
            extra["trace_id"] = trace_id
            line += " trace_id=%s"
            args.append(trace_id)
        self.logger.info(line, *args, extra=extra)
