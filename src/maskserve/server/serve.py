"""Run the app in this process: listen, follow stop signals with a drain a load balancer can follow.

On the first SIGTERM or SIGINT the server starts *draining* (see lifecycle.py): ``/readyz``
answers 503 and every response carries ``Connection: close``, while new requests are still
accepted and answered for ``--drain-delay`` seconds. A pod leaves its Service's endpoints at the
moment it gets SIGTERM, and proxies and load balancers learn of it seconds later (kube-proxy and
ingress controllers watch the endpoints, then reprogram): a server that closed its listener at once
would refuse requests still being routed to it. After the
delay (or at a second signal) the listener closes, what was accepted is answered within
``--drain-timeout`` (``app.drain_on_shutdown``), idle connections are closed, and :func:`serve`
returns: the process exits 0.

Every listener's connections pass through the service's connection guard (``serving/connection_guard.py``):
the header, body, write and keep-alive timeouts, and the cap on open connections, whose refusal
this module renders (a whole 503 in the error shape, sent before the request is read).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from aiohttp import web

from maskserve.errors import TooManyConnections
from maskserve.middleware.error_sanitizer import raw_error_response
from maskserve.request.access_log import AccessLogger
from maskserve.request.keys import service_of
from maskserve.serving.connection_guard import ConnectionGuard

log = logging.getLogger("maskserve")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Turns stop signals into: drain now, and stop listening after the delay or the next signal."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.stop = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None

    def received(self, signum: int) -> None:
        name = signal.Signals(signum).name
        service = service_of(self.app)
        lifecycle, settings = service.lifecycle, service.settings
        if not lifecycle.start_draining():
            if not self.stop.is_set():
                log.info("%s again: cutting the drain delay short", name)
                self.stop.set()
            return
        if settings.drain_delay <= 0:
            self.stop.set()
            return
        log.info(
            "%s: draining; /readyz answers 503 and requests are still served for %.1fs (--drain-delay)",
            name,
            settings.drain_delay,
        )
        self._timer = asyncio.get_running_loop().call_later(settings.drain_delay, self.stop.set)

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self.received, signum)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
        if self._timer is not None:
            self._timer.cancel()


class GuardedTCPSite(web.TCPSite):
    """A TCP listener whose every connection passes through the connection guard."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner, as TCPSite's own start does
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server), self._host, self._port, backlog=self._backlog
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


class GuardedSockSite(web.SockSite):
    """A listener on a socket already bound (a process manager's), its connections guarded."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket, guard: ConnectionGuard) -> None:
        super().__init__(runner, sock)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server), sock=self._sock, backlog=self._backlog
        )


def _connection_refusal() -> bytes:
    return raw_error_response(
        TooManyConnections("this server has as many client connections open as it allows; retry later")
    )


def make_runner(app: web.Application) -> web.AppRunner:
    settings = service_of(app).settings
    service_of(app).connections.refusal = _connection_refusal
    return web.AppRunner(
        app,
        handle_signals=False,  # StopSignals handles them: aiohttp's own would stop listening at once
        # Cancel a handler when its client disconnects, so its queued texts are dropped unrun.
        handler_cancellation=True,
        # Handlers finish within the drain budget (see app.drain_on_shutdown); then a margin.
        shutdown_timeout=settings.drain_timeout + 1.0,
        # The connection guard closes idle connections (and counts them); aiohttp's own idle
        # timer, which would wait for the client to take what its socket still holds, comes later.
        # On a listener without the guard (a test server's), aiohttp's timer is the one.
        keepalive_timeout=settings.keepalive_timeout + settings.header_timeout + 1.0,
        access_log_class=AccessLogger,
        access_log=logging.getLogger("maskserve.access"),
    )


async def serve(
    app: web.Application,
    sockets: Sequence[socket.socket] | Callable[[], Sequence[socket.socket]] = (),
    private_socket: Path | None = None,
    before_public: Callable[[web.Application], Awaitable[None]] | None = None,
) -> None:
    """Serve ``app`` until a stop signal has been followed through; raises OSError if it cannot listen.

    Listens on the settings' host and port, or on ``sockets`` already bound (a process manager's;
    a callable opens them once the app has started, so that no connection queues behind a load),
    and on ``private_socket``, a Unix socket for the server's own processes (workers.py). The
    private socket opens first, then ``before_public`` runs (a worker catching up with its
    siblings, which reach it from then on), then the public listeners open.
    """
    settings = service_of(app).settings
    runner = make_runner(app)
    await runner.setup()
    # The libraries and the model are now loaded: hundreds of thousands of objects that live as
    # long as the process. Collect start-up's garbage once, then move the rest out of the
    # collector's sight. A full collection would otherwise walk them all, holding the GIL (the
    # event loop stalls), and so would the interpreter's last collection at exit, which a rolling
    # restart waits for replica by replica (tests/unit/server/test_serve.py times the exit).
    gc.collect()
    gc.freeze()
    signals = StopSignals(app)
    try:
        guard = service_of(app).connections
        sites: list[web.BaseSite] = []
        if private_socket is not None:
            sites.append(web.UnixSite(runner, str(private_socket)))
            await sites[-1].start()
        if before_public is not None:
            await before_public(app)
        bound = sockets() if callable(sockets) else sockets
        public: list[web.BaseSite] = (
            [GuardedSockSite(runner, sock, guard) for sock in bound]
            if bound
            else [GuardedTCPSite(runner, settings.host, settings.port, guard)]
        )
        for site in public:
            await site.start()
        sites = public + sites
        signals.install()
        served = ", ".join(service_of(app).models)
        log.info("serving %s on %s", served, ", ".join(site.name for site in sites))
        await signals.stop.wait()
        log.info("closing the listener")
    finally:
        # Closes the listener, then runs the drain (on_shutdown), waits for the handlers, and
        # closes every connection; a connection still open gets no new request read.
        await runner.cleanup()
        signals.remove()
