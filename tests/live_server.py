"""Real servers for tests, started one way: ``python -m maskserve`` as a process, or the app in a thread.

Every test that needs a live server uses these; none starts a process itself.

- :func:`start_maskserve` runs the command users run, its output in a log file, and hands back a
  :class:`ServerProcess` to wait on, signal and stop; :func:`maskserve_process` is the same as a
  context manager that waits until the server is ready and stops it with SIGTERM, as an
  orchestrator would. :func:`run_maskserve` runs the command to its end, for start-up refusals.
- :func:`serve_in_thread` serves an app from its own event loop in a thread, through the same
  runner as ``maskserve`` (``serve.make_runner``), for synchronous clients (hypothesis examples,
  schemathesis' requests calls) that cannot share the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from maskserve.request.keys import service_of
from maskserve.server.serve import GuardedTCPSite, make_runner

# Start-up imports torch and transformers and warms the model up: seconds, more on 2 busy cores.
READY_TIMEOUT_S = 120.0
# An orchestrator's grace period, scaled down: a server that has not exited by then is killed.
STOP_TIMEOUT_S = 30.0


def until(condition: Callable[[], bool], timeout_s: float = 90.0) -> None:
    """Until ``condition()`` holds; a refused connection or a failed check counts as not yet (a
    worker still loading its models, a connection the shared socket took before any accepts)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (urllib.error.URLError, OSError, AssertionError):
            pass
        time.sleep(0.3)
    raise AssertionError("timed out")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now at ``host``, for a server started as a process."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a maskserve child: never the hub, no tokenizer fork warnings."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}


@dataclass
class ServerProcess:
    """A started ``python -m maskserve``: its process, where it listens, and its log."""

    process: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path
    # Where this run's output starts in the log (a restarted server appends to the same file).
    log_offset: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        """The base URL, without a trailing slash."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        """What this run wrote, stdout and stderr together."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_offset)
                return log.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Its exit code, once it has exited (raises ``subprocess.TimeoutExpired`` past the timeout)."""
        return self.process.wait(timeout_s)

    def wait_for_log(self, text: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until its log holds ``text``; fails with the log if it exits first or takes too long."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            if not self.running or time.monotonic() > deadline:
                raise RuntimeError(f"maskserve never logged {text!r} (exit {self.process.poll()}):\n{self.log()}")
            time.sleep(0.02)

    def stop(self) -> int:
        """SIGTERM, as an orchestrator sends; SIGKILL if it has not exited within the grace period."""
        if self.running:
            self.signal(signal.SIGTERM)
        try:
            return self.wait()
        except subprocess.TimeoutExpired:
            self.kill()
            return self.wait()

    def kill(self) -> None:
        """SIGKILL it (and its process group, when it has its own), whatever state it is in."""
        if not self.running:
            return
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(self.process.pid) == self.process.pid:
                os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


def start_maskserve(
    *args: str,
    log_path: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    own_process_group: bool = False,
) -> ServerProcess:
    """``python -m maskserve --host HOST --port PORT ARGS`` (a free port unless given), started
    now; its output is appended to ``log_path``. With ``own_process_group``, SIGKILL reaches its
    children too (``--workers``)."""
    port = free_port(host) if port is None else port
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "maskserve", "--host", host, "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            start_new_session=own_process_group,
        )
    return ServerProcess(process, host, port, log_path, offset)


def wait_until_ready(server: ServerProcess, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until ``/readyz`` answers 200; fails with the server's log if it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while True:
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            urllib.request.urlopen(server.url + "/readyz", timeout=5) as response,
        ):
            if response.status == 200:
                return
        if not server.running or time.monotonic() > deadline:
            raise RuntimeError(f"maskserve did not become ready (exit {server.process.poll()}):\n{server.log()}")
        time.sleep(0.05)


@contextmanager
def maskserve_process(
    *args: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    ready: bool = True,
) -> Iterator[ServerProcess]:
    """:func:`start_maskserve` in ``log_dir``, ready unless told not to wait, and stopped (SIGTERM,
    then SIGKILL past the grace period) on leaving."""
    port = free_port()
    server = start_maskserve(*args, log_path=log_dir / f"maskserve-{port}.log", port=port, env=env)
    try:
        if ready:
            wait_until_ready(server)
        yield server
    finally:
        server.stop()


def maskserve_command(*args: str) -> list[str]:
    """The command line of ``python -m maskserve ARGS`` (``batch ...`` for a job)."""
    return [sys.executable, "-m", "maskserve", *args]


def run_maskserve(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``python -m maskserve ARGS`` run to its end (a refusal at start-up, ``--help``, a batch job),
    output captured."""
    return subprocess.run(
        maskserve_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=child_env(env),
        check=False,
    )


@contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 with maskserve's own runner and yield its base URL; stop it
    (cleanup included) on exit."""
    loop = asyncio.new_event_loop()
    runner = make_runner(app)
    started = threading.Event()
    port: list[int] = []

    async def start() -> None:
        await runner.setup()
        site = GuardedTCPSite(runner, "127.0.0.1", 0, service_of(app).connections)
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
