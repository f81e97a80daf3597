"""A load signal for balancers, apart from readiness: HAProxy's agent-check on ``--agent-port``.

Readiness says whether this server can serve at all; load is a matter of degree, and a balancer
that steers by it should lower a busy replica's share, never take it out (a fleet whose replicas
all left rotation answers with refused connections instead of 503 with Retry-After). HAProxy's
agent-check connects to a TCP port and reads one line: here ``ready up 73%``, the server's weight
as a share of its configured one, from 100% idle down to 1% (never 0: a weight of 0 would take
the replica out after all), or ``drain`` once the server shuts down. Each connection is answered
from memory, on the event loop, and closed.

The load is the larger of the queue's fill and the predicted wait for one more text as a share of
the request timeout: either says how soon this replica would refuse a request at the door.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from maskserve.request.keys import service_of
from maskserve.service.lifecycle import Lifecycle
from maskserve.serving.batcher import Batcher
from maskserve.serving.costs import ONE_TEXT

log = logging.getLogger(__name__)

# The lowest weight reported: HAProxy sends a server of weight 0 nothing at all.
MIN_WEIGHT_PERCENT = 1


def load(batchers: Sequence[Batcher], request_timeout: float) -> float:
    """How close to refusing work at the door this server is: 0 idle, 1 refusing; with several
    models, the busiest one's (a balancer cannot send one model's requests elsewhere alone)."""
    loads = (
        max(batcher.depth / batcher.settings.max_queue, batcher.predicted_wait(ONE_TEXT) / request_timeout)
        for batcher in batchers
    )
    return min(1.0, max(0.0, *loads))


def agent_line(batchers: Sequence[Batcher], lifecycle: Lifecycle, request_timeout: float) -> str:
    """The one line HAProxy's agent-check reads (see the module docstring)."""
    if lifecycle.draining or any(batcher.closed for batcher in batchers):
        return "drain\n"
    weight = max(MIN_WEIGHT_PERCENT, round(100 * (1.0 - load(batchers, request_timeout))))
    return f"ready up {weight}%\n"


def agent_context(port: int) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """Serve the agent on ``port`` for the app's life, once its model is loaded (a ``cleanup_ctx``)."""

    @contextlib.asynccontextmanager
    async def context(app: web.Application) -> AsyncIterator[None]:
        service = service_of(app)
        settings = service.settings

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                batchers = [served.loaded.batcher for served in service.models.values()]
                line = agent_line(batchers, service.lifecycle, settings.request_timeout)
                writer.write(line.encode("ascii"))
                await writer.drain()
            except ConnectionError:
                pass  # the checker left first: nothing to tell it
            finally:
                writer.close()

        # reuse_port: with --workers, every worker listens on the port and answers for itself.
        server = await asyncio.start_server(answer, settings.host, port, reuse_port=True)
        log.info("HAProxy agent on %s:%d", settings.host, port)
        try:
            yield
        finally:
            server.close()
            await server.wait_closed()

    return context
