"""The connection stage: tells the connection guard when a request's head is in, and writes its
answer within ``--write-timeout``.

The app factory puts it outermost, before the chain (it is not one of the chain's stages, which an
operator may remove or reorder), and it writes the response itself (aiohttp's own write then finds
it done): a client that does not read its answer is cut when the time runs out, and
the bytes the socket still held are dropped with it (``serving/connection_guard.py``). A response the other
stages made is never changed here. It raises nothing of its own.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler

from maskserve.request.keys import service_of, state_of
from maskserve.serving.connection_guard import ConnectionGuard


async def _write(guard: ConnectionGuard, request: web.Request, response: web.StreamResponse) -> None:
    transport = request.transport
    # Answers made in memory (every API answer, error and page): those are what a slow reader
    # holds. A file (the page's static files) prepares itself in a way that must run only once,
    # and a streamed answer is written by its handler: both are left to aiohttp.
    if transport is None or type(response) is not web.Response or response.prepared:
        return
    body = response.body
    seconds = guard.writing(transport, len(body) if isinstance(body, bytes) else 0)
    try:
        async with asyncio.timeout(seconds):
            await response.prepare(request)
            await response.write_eof()
    except TimeoutError:
        guard.close(transport, "write_timeout")
    except ConnectionError:
        pass  # the client left: aiohttp's own write finds the same and says nothing more
    finally:
        guard.written(transport)


@web.middleware
async def connections_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    guard = service_of(request.app).connections
    connection = guard.connection_of(request.transport)
    if connection is not None:
        connection.request_started()
    try:
        response = await handler(request)
        await _write(guard, request, response)
        close_after = state_of(request).close_after
        if close_after is not None and request.transport is not None:
            guard.close(request.transport, close_after)
        return response
    finally:
        if connection is not None:
            connection.request_finished()
