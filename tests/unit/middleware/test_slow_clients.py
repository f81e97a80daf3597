"""slow_clients.py behind the real connection guard (``serve_in_thread``): a request whose head is in
is not cut by the header timeout, its connection idles after its answer, and an answer its client
does not read is cut at ``--write-timeout`` while others are still served."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from maskserve.config.bounds import settings_from
from maskserve.http.app import create_app
from maskserve.request.keys import service_of
from maskserve.serving.connection_guard import ConnectionGuard
from tests.fakes import ControlledModel, EchoModel
from tests.live_server import serve_in_thread

BODY = b"a [MASK] here."


@contextmanager
def guarded(model: ControlledModel, **overrides: Any) -> Iterator[tuple[int, ConnectionGuard]]:
    """The real app served behind its connection guard: its port and the guard."""
    app = create_app(settings_from({"warmup": False, **overrides}), engine=model)
    with serve_in_thread(app) as url:
        port = urlsplit(url).port
        assert port is not None
        yield port, service_of(app).connections


def post(body: bytes = BODY) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: test\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP response's status and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), await asyncio.wait_for(reader.readexactly(length), 10)


async def until(check: Any, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_a_request_whose_head_is_in_is_not_cut_by_the_header_timeout() -> None:
    model = ControlledModel()
    with guarded(model, header_timeout=0.3) as (port, guard):
        model.hold()
        # Released well after the header timeout would have cut a connection still in its head.
        threading.Timer(1.0, model.release).start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post())
        status, body = await answer(reader)
        writer.close()
        assert status == 200 and body.startswith(b"[")
        assert guard.closed["header_timeout"] == 0


async def test_after_its_answer_a_connection_idles_until_the_keepalive_timeout() -> None:
    with guarded(ControlledModel(), keepalive_timeout=0.3) as (port, guard):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # the same connection, kept alive between its requests
            writer.write(post())
            assert (await answer(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server once idle
        writer.close()
        assert guard.closed["idle"] == 1


async def test_an_answer_its_client_does_not_read_is_cut_at_the_write_timeout() -> None:
    # Each prediction carries the model's word twice: an answer far larger than the sockets hold.
    model = ControlledModel(EchoModel(word="x" * 1_000_000))
    with guarded(model, write_timeout=0.5, max_response_bytes=16 * 1_048_576) as (port, guard):
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", port))
        try:
            stuck.sendall(post(b"[MASK] [MASK] [MASK] [MASK] [MASK]"))  # and never reads
            await until(lambda: guard.closed["write_timeout"] == 1)
            assert guard.unsent_bytes() == 0  # its answer is no longer held
        finally:
            stuck.close()
        # Another client is served meanwhile, in full.
        model.inner = EchoModel()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post())
        status, body = await answer(reader)
        writer.close()
        assert status == 200 and body.startswith(b"[")
