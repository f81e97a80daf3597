"""Logging, configured in one place: level and format from the settings, every line one line."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

# Every character that could end a log line or hide part of one: C0 and C1 controls, DEL, and
# Unicode's own line and paragraph separators. A client's path, header or id may hold any of them
# (a path is percent-decoded: /%0d%0a... becomes a CR LF), and one left raw would forge a line.
_CONTROL = [*range(0x00, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _CONTROL}


def escape_control(text: str) -> str:
    """``text`` with every control character written as an escape (``\\r`` as ``\\x0d``): one line."""
    return text.translate(_ESCAPES)


class OneLineFormatter(logging.Formatter):
    """The plain-text format, where a message can never break its line: control characters in it
    are escaped, whoever logged it. A traceback, formatted apart, keeps its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_control(super().formatMessage(record))


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
        handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
