"""Logging, configured in one place: level and format from the settings, one access line per request."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from .keys import ERROR_KIND_KEY, REQUEST_ID_KEY, TRACE_ID_KEY


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the extra fields the access logger attaches."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "method", "path", "status", "kind", "latency_ms", "trace_id"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, json_lines: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class AccessLogger(AbstractAccessLogger):
    """``request_id method path status kind latency`` for every request, errors included, and
    ``trace_id=...`` when the request was traced (the tracing stage is on)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        request_id = request.get(REQUEST_ID_KEY, "-")
        kind = request.get(ERROR_KIND_KEY, "ok" if response.status < 400 else "-")
        latency_ms = round(time * 1000, 2)
        extra: dict[str, Any] = {
            "request_id": request_id,
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "kind": kind,
            "latency_ms": latency_ms,
        }
        line = "%s %s %s %d %s %.2fms"
        args: list[Any] = [request_id, request.method, request.path, response.status, kind, latency_ms]
        trace_id = request.get(TRACE_ID_KEY)
        if trace_id is not None:
            extra["trace_id"] = trace_id
            line += " trace_id=%s"
            args.append(trace_id)
        self.logger.info(line, *args, extra=extra)
