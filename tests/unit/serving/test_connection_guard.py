"""connections.py without HTTP: each phase's timer on real loopback sockets, the cap on open
connections, and the bound on answers not yet taken."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from maskserve.config.settings import Settings
from maskserve.serving.connection_guard import CLOSE_REASONS, Connection, ConnectionGuard

REFUSAL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def limits(**changes: float) -> Settings:
    """Short bounds, so that each timer is seen quickly; ``changes`` over them."""
    short = {"header_timeout": 0.3, "keepalive_timeout": 0.3, "body_timeout": 5.0, "write_timeout": 5.0}
    short.update(changes)
    return dataclasses.replace(Settings(), **short)


@dataclass
class Inner(asyncio.Protocol):
    """The HTTP server's side, as the guard sees it: it only receives."""

    received: bytearray = field(default_factory=bytearray)
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()


@dataclass
class Server:
    port: int
    inners: list[Inner]
    clients: list[asyncio.StreamWriter | socket.socket] = field(default_factory=list)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        return reader, writer

    def connect_not_reading(self) -> socket.socket:
        """A client with a small receive buffer that never reads."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", self.port))
        self.clients.append(sock)
        return sock


@asynccontextmanager
async def guarded_server(guard: ConnectionGuard) -> AsyncIterator[Server]:
    inners: list[Inner] = []

    def make_inner() -> Inner:
        inners.append(Inner())
        return inners[-1]

    listener = await asyncio.get_running_loop().create_server(guard.protocol_factory(make_inner), "127.0.0.1", 0)
    server = Server(listener.sockets[0].getsockname()[1], inners)
    try:
        yield server
    finally:
        listener.close()
        for client in server.clients:
            client.close()
        for connection in list(guard.open.values()):
            if connection.transport is not None:
                connection.transport.abort()
        await asyncio.sleep(0.01)  # let the transports finish closing


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before it closed the connection, failing if it stays open longer."""
    return await asyncio.wait_for(reader.read(), seconds)


def connection(guard: ConnectionGuard) -> Connection:
    [only] = guard.open.values()
    return only


async def test_a_connection_that_never_finishes_its_headers_is_closed_at_the_header_timeout() -> None:
    guard = ConnectionGuard(limits(header_timeout=0.3))
    async with guarded_server(guard) as server:
        reader, writer = await server.connect()
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        started = asyncio.get_running_loop().time()
        assert await closed_within(reader, 2.0) == b""
        assert 0.25 <= asyncio.get_running_loop().time() - started < 1.0
        await asyncio.wait_for(server.inners[0].lost.wait(), 1.0)
    assert guard.closed["header_timeout"] == 1 and not guard.open


async def test_a_request_being_served_is_not_cut_by_the_header_timeout() -> None:
    guard = ConnectionGuard(limits(header_timeout=0.2, keepalive_timeout=0.3))
    async with guarded_server(guard) as server:
        reader, writer = await server.connect()
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.05)
        connection(guard).request_started()
        await asyncio.sleep(0.5)  # past the header timeout, still serving
        assert guard.open and not guard.closed
        connection(guard).request_finished()
        # Idle now: closed at the keep-alive timeout, counted as idle.
        assert await closed_within(reader, 2.0) == b""
    assert guard.closed == {"idle": 1}


async def test_an_idle_connection_gets_the_header_timeout_again_from_its_next_first_byte() -> None:
    guard = ConnectionGuard(limits(header_timeout=0.3, keepalive_timeout=5.0))
    async with guarded_server(guard) as server:
        reader, writer = await server.connect()
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.05)
        connection(guard).request_started()
        connection(guard).request_finished()
        await asyncio.sleep(0.5)  # idle, well within keep-alive
        assert guard.open
        writer.write(b"GET")  # the next request starts, and trickles
        started = asyncio.get_running_loop().time()
        assert await closed_within(reader, 2.0) == b""
        assert asyncio.get_running_loop().time() - started < 1.0
    assert guard.closed == {"header_timeout": 1}


async def test_past_max_connections_a_new_one_gets_the_refusal_and_is_closed() -> None:
    guard = ConnectionGuard(limits(max_connections=2, header_timeout=5.0), refusal=lambda: REFUSAL)
    async with guarded_server(guard) as server:
        kept = [await server.connect() for _ in range(2)]
        await asyncio.sleep(0.05)
        reader, _ = await server.connect()
        assert await closed_within(reader, 2.0) == REFUSAL
        assert len(server.inners) == 2  # the refused one never reached the HTTP server
        assert len(guard.open) == 2 and guard.closed == {"connection_limit": 1}
        # One leaves: the next is let in.
        kept[0][1].close()
        await asyncio.sleep(0.1)
        await server.connect()
        await asyncio.sleep(0.05)
        assert len(server.inners) == 3 and guard.closed == {"connection_limit": 1}


async def test_the_slowest_readers_are_closed_to_make_room_for_a_new_answer() -> None:
    guard = ConnectionGuard(limits(max_unsent_bytes=40 << 20, header_timeout=30.0))
    async with guarded_server(guard) as server:
        for _ in range(3):
            server.connect_not_reading()
        await asyncio.sleep(0.1)
        first, second, third = (c.transport for c in guard.open.values())
        assert first is not None and second is not None and third is not None
        for transport in (first, second):
            guard.writing(transport, 16 << 20)
            transport.write(b"x" * (16 << 20))  # the kernel takes a part; the rest waits here
            await asyncio.sleep(0.05)
        assert guard.unsent_bytes() == 32 << 20 and not guard.closed
        # A third answer that fits once the oldest is gone, and not before: the oldest is cut.
        guard.writing(third, 12 << 20)
        assert guard.closed == {"unsent_bytes": 1}
        assert first.is_closing() and not second.is_closing() and not third.is_closing()
        assert first.get_write_buffer_size() == 0  # its buffered answer dropped at once
        assert guard.unsent_bytes() == 28 << 20
        # A write that ends leaves the count.
        guard.written(second)
        assert guard.unsent_bytes() == 12 << 20


def test_every_close_reason_is_known_to_the_metrics() -> None:
    assert set(CLOSE_REASONS) == {
        "header_timeout",
        "body_timeout",
        "write_timeout",
        "unsent_bytes",
        "idle",
        "connection_limit",
    }


@pytest.mark.parametrize("reason", ["write_timeout", "body_timeout"])
async def test_a_close_drops_what_the_socket_holds_and_counts_once(reason: str) -> None:
    guard = ConnectionGuard(limits(header_timeout=30.0))
    async with guarded_server(guard) as server:
        server.connect_not_reading()
        await asyncio.sleep(0.05)
        transport = connection(guard).transport
        assert transport is not None
        transport.write(b"x" * (4 << 20))
        assert transport.get_write_buffer_size() > 0
        guard.close(transport, reason)
        guard.close(transport, reason)  # a second close of the same connection changes nothing
        assert transport.get_write_buffer_size() == 0  # abort, not a close that waits for the reader
        await asyncio.wait_for(server.inners[0].lost.wait(), 1.0)
        assert guard.closed == {reason: 1} and not guard.open
