"""Request metrics: count and time every response exactly as the client got it.

It sits outside the error middleware, so it sees final statuses and error kinds, never raw
exceptions; it only observes and never raises on its own.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from maskserve.request.keys import service_of, state_of

# nginx's code for "the client closed the connection before the answer": no response was sent.
CLIENT_CLOSED = 499


def route_label(request: web.Request) -> str:
    """The route's name from the route table; one label for every path that matched none."""
    return request.match_info.route.name or "unmatched"


def kind_label(request: web.Request, status: int) -> str:
    return state_of(request).kind or ("ok" if status < 400 else "error")


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = service_of(request.app).metrics
    state = state_of(request)
    started = time.perf_counter()

    def observe(status: int, kind: str | None = None) -> None:
        """Count and time this request as answered ``status``; ``kind`` defaults to :func:`kind_label`'s."""
        # state.model: the served model the handler resolved ("" until then, and for unknown names).
        seconds = time.perf_counter() - started
        metrics.observe_request(route_label(request), status, kind or kind_label(request, status), seconds, state.model)

    try:
        response = await handler(request)
    except web.HTTPException as exc:  # redirects: the error middleware lets them through
        observe(exc.status)
        raise
    except asyncio.CancelledError:  # the client left and aiohttp cancelled its handler
        observe(CLIENT_CLOSED, "client_closed")
        raise
    observe(response.status)
    if state.answers:
        metrics.observe_answers(state.answers, state.windows, state.model)
    return response
