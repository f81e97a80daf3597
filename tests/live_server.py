"""Real servers for tests: ``python -m maskserve`` as a process, or the app served in a thread.

:func:`maskserve_process` runs the command users run, on a free loopback port, and stops it with
SIGTERM as an orchestrator would. :func:`serve_in_thread` serves an app from its own event loop in
a thread, for synchronous clients (hypothesis examples, schemathesis' requests calls) that cannot
share the test's event loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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


# Start-up imports torch and transformers and warms the model up: seconds, more on 2 busy cores.
READY_TIMEOUT_S = 120.0


@dataclass
class ServerProcess:
    """A running ``python -m maskserve``: its base URL (no trailing slash) and its log."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def wait_until_ready(server: ServerProcess, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until ``/readyz`` answers 200; fails with the server's log if it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(server.url + "/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if server.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"maskserve did not become ready (exit {server.process.poll()}):\n{server.log()}")
        time.sleep(0.1)


@contextmanager
def maskserve_process(
    *args: str, log_dir: Path, env: Mapping[str, str] | None = None, ready: bool = True
) -> Iterator[ServerProcess]:
    """``python -m maskserve --port FREE ARGS``, its output in ``log_dir``; ready unless told not to
    wait; stopped with SIGTERM (killed if it does not exit) on leaving."""
    port = free_port()
    log_path = log_dir / f"maskserve-{port}.log"
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "maskserve", "--port", str(port), *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=environ,
        )
    server = ServerProcess(process, f"http://127.0.0.1:{port}", log_path)
    try:
        if ready:
            wait_until_ready(server)
        yield server
    finally:
        if process.poll() is None:
            stop_server(process)


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
