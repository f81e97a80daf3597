"""Client connections: how long each may take to send a request and to take its answer, how many
may be open, and how many bytes of answers slow readers may hold. Plain asyncio, no HTTP.

Every connection passes through a :class:`Connection`, a thin protocol in front of the HTTP
server's own, which it creates only for a connection it accepts. A connection is in one of four
phases, each bounded by its own setting:

- **head**: from the connection's opening (or a later request's first byte) until its request's
  headers are in: ``--header-timeout``. The HTTP stage tells the guard that the head is in by
  :meth:`Connection.request_started`, when it first sees the request.
- **request**: the body is read, under ``--body-timeout``, where the handlers read it; then the
  request's own deadline holds.
- **write**: the answer is handed to the socket: ``--write-timeout``, timed by the HTTP stage that
  writes it (:meth:`ConnectionGuard.writing`). Answers written and not yet taken, across
  connections, are bounded by ``--max-unsent-bytes``: past it, the connections whose answers
  have waited longest (the slowest readers) are closed to make room for the new answer. Refusing
  new requests instead would let a few clients that never read deny the server to everyone; this
  way only they lose, and normal clients keep being answered.
- **idle**: between requests on a kept-alive connection: ``--keepalive-timeout``.

A phase that runs out closes the connection with ``abort``, not ``close``: ``close`` would wait
for the peer to take what the socket still holds, which a client that does not read never does,
and the buffered answer would stay in memory. Each close is counted by reason and logged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from maskserve.config.settings import Settings
from maskserve.serving.memory import release_freed_memory

log = logging.getLogger("maskserve.connections")

# Why a connection was closed by the server; each is exported at 0 from the start.
CLOSE_REASONS = ("header_timeout", "body_timeout", "write_timeout", "unsent_bytes", "idle", "connection_limit")
# Closes that drop an answer of up to --max-response-bytes: the freed memory is handed back.
DROPS_ANSWERS = ("write_timeout", "unsent_bytes")
# Seconds after such a close before the memory is handed back: by then the answer's last
# references (its response, the handler's task) are gone too; several closes share one trim.
TRIM_DELAY_S = 1.0


class Connection(asyncio.Protocol):
    """One client connection: forwards everything to the HTTP server's protocol and times its phases."""

    def __init__(self, guard: ConnectionGuard, make_inner: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self._make_inner = make_inner
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._phase = "head"
        self._closed_by: str | None = None

    # asyncio's side: what the transport calls.
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.guard.admit(self):
            return
        self.inner = self._make_inner()
        self.inner.connection_made(transport)
        self._start("head", self.guard.settings.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._phase == "idle":
            # The next request's first byte: its headers are due within the header timeout.
            self._start("head", self.guard.settings.header_timeout)
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.guard.forget(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    # The HTTP side: what the stage that sees each request tells it.
    def request_started(self) -> None:
        """The request's headers are in: the head's timer stops; its body has its own."""
        self._cancel_timer()
        self._phase = "request"

    def request_finished(self) -> None:
        """The answer is written: the connection idles until its next request, or closes."""
        if self._closed_by is None:
            self._start("idle", self.guard.settings.keepalive_timeout)

    def close(self, reason: str) -> None:
        """Close now, dropping whatever the socket still holds, and count why (once)."""
        if self._closed_by is not None or self.transport is None:
            return
        self._closed_by = reason
        self._cancel_timer()
        self.guard.closed_for(reason, self)
        self.transport.abort()

    def _start(self, phase: str, seconds: float) -> None:
        self._cancel_timer()
        self._phase = phase
        reason = "header_timeout" if phase == "head" else phase
        self._timer = asyncio.get_running_loop().call_later(seconds, self.close, reason)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ConnectionGuard:
    """Every open client connection, the answers being written, and what was closed and why."""

    def __init__(self, settings: Settings, refusal: Callable[[], bytes] = lambda: b"") -> None:
        # Its bounds: the header, body, write and keep-alive timeouts, max_connections and
        # max_unsent_bytes.
        self.settings = settings
        # The bytes sent, then the connection closed, when it would exceed max_connections: a
        # whole HTTP response, made by the HTTP side (this module knows no HTTP).
        self.refusal = refusal
        self.open: dict[asyncio.BaseTransport, Connection] = {}
        # The size of each answer being written, by transport, oldest write first (a dict keeps
        # the order of insertion, and each write leaves before its connection starts another).
        self._writes: dict[asyncio.Transport, int] = {}
        self.closed: Counter[str] = Counter()
        self._trim: asyncio.TimerHandle | None = None

    def _trimmed(self) -> None:
        self._trim = None
        release_freed_memory()

    def protocol_factory(self, make_inner: Callable[[], asyncio.Protocol]) -> Callable[[], Connection]:
        """A factory for ``loop.create_server``: each connection guarded, in front of ``make_inner()``'s."""
        return lambda: Connection(self, make_inner)

    def admit(self, connection: Connection) -> bool:
        """Count the new connection in, or answer it with the refusal and close it."""
        if len(self.open) >= self.settings.max_connections:
            assert connection.transport is not None
            connection.transport.write(self.refusal())
            # The refusal is small and already in the socket: close (not abort) lets it leave.
            connection.transport.close()
            self.closed_for("connection_limit", None)
            return False
        assert connection.transport is not None
        self.open[connection.transport] = connection
        return True

    def forget(self, connection: Connection) -> None:
        if connection.transport is not None:
            self.open.pop(connection.transport, None)
            self._writes.pop(connection.transport, None)

    def connection_of(self, transport: asyncio.BaseTransport | None) -> Connection | None:
        """The guarded connection on ``transport``; None for one that is not (a test server's)."""
        return self.open.get(transport) if transport is not None else None

    def close(self, transport: asyncio.Transport, reason: str) -> None:
        """Close the connection on ``transport`` now, dropping what it holds, counted by ``reason``."""
        connection = self.connection_of(transport)
        if connection is not None:
            connection.close(reason)
        elif not transport.is_closing():
            self.closed_for(reason, None)
            transport.abort()

    def closed_for(self, reason: str, connection: Connection | None) -> None:
        self.closed[reason] += 1
        if reason in DROPS_ANSWERS and self._trim is None:
            self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._trimmed)
        peer = connection.transport.get_extra_info("peername") if connection and connection.transport else None
        # Once per connection, never per byte; an idle keep-alive ending is routine, so quieter.
        level = logging.DEBUG if reason == "idle" else logging.INFO
        log.log(level, "closed a connection%s: %s", f" from {peer[0]}" if peer else "", reason.replace("_", " "))

    # Answers in flight.
    def writing(self, transport: asyncio.Transport, size: int) -> float:
        """An answer of ``size`` bytes starts to be written on ``transport``: room is made for it
        under ``max_unsent_bytes``; returns the seconds it has."""
        self.make_room(size)
        self._writes.pop(transport, None)  # a write is placed by when it started
        self._writes[transport] = size
        return self.settings.write_timeout

    def written(self, transport: asyncio.Transport) -> None:
        self._writes.pop(transport, None)

    def make_room(self, size: int) -> None:
        """Close the connections whose answers have waited longest until ``size`` more bytes fit."""
        held = self.unsent_bytes()
        for transport, written in list(self._writes.items()):  # oldest first
            if held + size <= self.settings.max_unsent_bytes:
                return
            if not transport.is_closing():
                held -= written
                self.close(transport, "unsent_bytes")

    def unsent_bytes(self) -> int:
        """Bytes of the answers being written and not yet wholly taken by their clients: each is
        held in memory whole until its write ends (and the socket's buffer holds a copy of the rest)."""
        return sum(size for transport, size in self._writes.items() if not transport.is_closing())
