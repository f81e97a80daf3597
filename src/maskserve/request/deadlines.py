"""Each request's deadline: the server default, shortened (never lengthened) by the client."""

from __future__ import annotations

import asyncio
import math

from aiohttp import web

from maskserve.errors import InvalidHeader
from maskserve.request.keys import service_of, state_of

TIMEOUT_HEADER = "X-Request-Timeout"


def parse_timeout(header: str | None, default: float) -> float:
    """Seconds this request may take: ``min(header, default)``; a bad header is a 400."""
    if header is None:
        return default
    try:
        value = float(header)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise InvalidHeader(f"{TIMEOUT_HEADER} must be a positive number of seconds, like 2.5", field=TIMEOUT_HEADER)
    return min(value, default)


def request_deadline(request: web.Request) -> float:
    """The deadline on the event loop's clock, computed once per request and remembered."""
    state = state_of(request)
    if state.deadline is None:
        timeout = parse_timeout(request.headers.get(TIMEOUT_HEADER), service_of(request.app).settings.request_timeout)
        state.deadline = asyncio.get_running_loop().time() + timeout
    return state.deadline
