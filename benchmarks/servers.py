"""Servers under test as real subprocesses: start, wait until they answer, pause, measure, stop.

Only one server computes at a time: the others are paused with SIGSTOP, so that on a 2-core
machine they cannot take cycles (a timer, a garbage collection) from the one being measured.
"""

from __future__ import annotations

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
from pathlib import Path

PROBE = "paris is the [MASK] of france."
# More than maskserve's worker heartbeat (workers.HEARTBEAT_S, 2 s).
WORKER_HEARTBEAT_S = 2.5


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def maskserve_argv(model: Path, port: int, *extra: str) -> list[str]:
    """maskserve on its defaults, plus ``extra`` flags (``--backend onnxruntime --cache-dir ...``)."""
    return [sys.executable, "-m", "maskserve", "--model", str(model), "--port", str(port), *extra]


def seed_argv(model: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "benchmarks.seed_server", "--model", str(model), "--port", str(port)]


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (VmRSS in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Server:
    """One server process, its log in ``log_path``; a context manager that always stops it."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        log_path: Path,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.url = f"http://{host}:{port}/"
        self.log_path = log_path
        self.env = env or {}  # added to the environment (OTEL_TRACES_EXPORTER for a traced run)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.process.pid

    def start(self, ready_timeout_s: float = 300.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **self.env}
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            # Its own process group: pausing a server pauses its workers too (--workers).
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.log_tail()}")
            if self._answers():
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {ready_timeout_s:.0f}s: {self.log_tail()}")

    def _answers(self) -> bool:
        request = urllib.request.Request(self.url, data=PROBE.encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def pause(self) -> None:
        os.killpg(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        children = self._children()
        if children:
            # A process manager (gunicorn, --workers) kills a worker whose heartbeat is older than
            # its timeout: let the workers beat again before the arbiter looks.
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGCONT)
            time.sleep(WORKER_HEARTBEAT_S)
        os.killpg(self.pid, signal.SIGCONT)

    def _children(self) -> list[int]:
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children", encoding="ascii") as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.resume()  # a stopped process would not act on SIGTERM
            self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(ProcessLookupError):  # a worker its parent left behind
            os.killpg(self.process.pid, signal.SIGKILL)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class RssSampler:
    """Samples a process's resident memory every ``interval_s`` on a daemon thread."""

    def __init__(self, pid: int, interval_s: float) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []  # (seconds since start, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._started = time.monotonic()

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, RuntimeError):  # the process may have just exited
                self.samples.append((time.monotonic() - self._started, rss_bytes(self.pid)))
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> RssSampler:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples
