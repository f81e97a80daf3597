"""The real app on a real loopback port, served from its own event loop in a thread.

For synchronous clients (hypothesis examples, schemathesis' requests calls) that cannot share the
test's event loop. Same factory and the same handler cancellation as ``python -m maskserve``.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web


def free_port() -> int:
    """A loopback port nobody listens on now, for a server started as a subprocess."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM a server subprocess, as an orchestrator would; kill it if it does not exit in 30 s."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()


@contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 and yield its base URL; stop it (cleanup included) on exit."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    started = threading.Event()
    port: list[int] = []

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(runner.addresses[0][1])

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, name="maskserve-live-server", daemon=True)
    thread.start()
    if not started.wait(60):
        raise RuntimeError("the live server did not start")
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
