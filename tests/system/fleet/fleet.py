"""The fleet's moving parts: replicas as real processes, what HAProxy says about them, steady load.

Everything runs on loopback: each replica on its own address (127.0.0.11-13, which Linux routes to
lo without setup), HAProxy on 127.0.0.10. Each process gets its own process group, so a test that
fails half way still leaves nothing running (the fixtures kill the groups).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.haproxy import Address, HAProxy, ServerState, documented_replica_flags
from benchmarks.load import Expected, LoadResult, run_load
from tests.live_server import ServerProcess, start_maskserve, wait_until_ready
from tests.paths import ROOT

ARTIFACTS = ROOT / "artifacts"

# The replicas run with the flags the example documents (--drain-delay 2 --torch-threads 1), so
# what is proven here is what users start from. Added: --max-queue 32 (not 256), small enough
# that the overload test can fill one replica's queue from this process; 16 clients spread over
# the fleet never come near it, so it changes nothing in the other tests. Set alone: the request
# limits it bounds (--max-inputs, --max-score-tokens, --max-word-copies) follow it down to 32.
DOCUMENTED_FLAGS = documented_replica_flags()
REPLICA_ARGS = (*DOCUMENTED_FLAGS, "--max-queue", "32")
DRAIN_DELAY_S = float(DOCUMENTED_FLAGS[DOCUMENTED_FLAGS.index("--drain-delay") + 1])
# Start-up imports torch and transformers: 5-20 s on 2 busy cores.
READY_TIMEOUT_S = 120.0

CLIENTS = 16
# Bounds of every steady load: it ends when its test says so, or at these caps at the latest.
MAX_REQUESTS = 200_000
TIME_CAP_S = 240.0


class Replica:
    """One ``python -m maskserve`` on the default model at its own address; restartable."""

    def __init__(self, address: Address, log_dir: Path) -> None:
        self.address = address
        self.name = address.name
        self.url = address.url
        self.log_path = log_dir / f"{address.name}.log"
        self.server: ServerProcess | None = None

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        agent = ["--agent-port", str(self.address.agent_port)] if self.address.agent_port is not None else []
        self.server = start_maskserve(
            *agent,
            *REPLICA_ARGS,
            log_path=self.log_path,
            host=self.address.host,
            port=self.address.port,
            own_process_group=True,
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until ``/readyz`` answers 200 (the model is loaded and the port open)."""
        assert self.server is not None
        wait_until_ready(self.server, timeout_s)

    def send(self, signum: signal.Signals) -> None:
        assert self.server is not None
        self.server.signal(signum)

    def wait_exit(self, timeout_s: float) -> int:
        assert self.server is not None
        return self.server.wait(timeout_s)

    def output(self) -> str:
        """What the current (or last) run wrote."""
        return self.server.log() if self.server is not None else "(no log)"

    def kill_group(self) -> None:
        """SIGKILL the process group, whatever state it is in (teardown)."""
        if self.server is not None:
            self.server.kill()


class Rotation:
    """HAProxy's view of its servers, polled every 10 ms on a thread: when each changed state or weight.

    A thread, not a task: the event loop is busy with the clients, and a check result seen late
    would make the measured times look worse than HAProxy is.
    """

    def __init__(self, haproxy: HAProxy) -> None:
        self.haproxy = haproxy
        self.changes: list[tuple[float, str, ServerState]] = []  # (monotonic time, server, new state)
        self.latest: dict[str, ServerState] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            with contextlib.suppress(OSError):
                states = self.haproxy.states()
                now = time.monotonic()
                for name, state in states.items():
                    before = self.latest.get(name)
                    if before is None or (before.status, before.check, before.weight) != (
                        state.status,
                        state.check,
                        state.weight,
                    ):
                        self.changes.append((now, name, state))
                self.latest = states

    def __enter__(self) -> Rotation:
        self.latest = self.haproxy.states()
        self._thread = threading.Thread(target=self._run, name="haproxy-rotation", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def first(
        self, server: str, condition: Callable[[ServerState], bool], since: float
    ) -> tuple[float, ServerState] | None:
        """When ``server`` first met ``condition`` at or after ``since``, and its state then."""
        for at, name, state in list(self.changes):
            if name == server and at >= since and condition(state):
                return at, state
        return None

    async def wait_for(
        self, server: str, condition: Callable[[ServerState], bool], since: float, timeout_s: float
    ) -> tuple[float, ServerState]:
        deadline = time.monotonic() + timeout_s
        while (found := self.first(server, condition, since)) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{server}: condition not met within {timeout_s}s; changes {self.changes}")
            await asyncio.sleep(0.01)
        return found

    async def wait_now(self, server: str, condition: Callable[[ServerState], bool], timeout_s: float) -> None:
        """Until ``server``'s latest state meets ``condition``."""
        deadline = time.monotonic() + timeout_s
        while not condition(self.latest[server]):
            if time.monotonic() > deadline:
                raise AssertionError(f"{server}: condition not met within {timeout_s}s: {self.latest[server]}")
            await asyncio.sleep(0.01)

    async def wait_serving(self, server: str, timeout_s: float) -> float:
        """Until HAProxy has sent ``server`` a new connection (it is back in rotation *and* used)."""
        sessions = self.latest[server].sessions
        deadline = time.monotonic() + timeout_s
        while self.latest[server].sessions <= sessions:
            if time.monotonic() > deadline:
                raise AssertionError(f"{server} got no traffic within {timeout_s}s: {self.latest}")
            await asyncio.sleep(0.01)
        return time.monotonic()


def out_of_rotation(state: ServerState) -> bool:
    return not state.in_rotation


def in_rotation(state: ServerState) -> bool:
    # Fully UP: "UP 1/2" would be a server seen failing once and about to go down.
    return state.status == "UP"


@dataclass(frozen=True)
class Workload:
    """Sentences with the answer a replica gave each one directly, before any balancer."""

    sentences: list[str]
    expected: list[Expected]


def direct_answers(url: str, sentences: list[str]) -> Workload:
    """Ask one replica for each sentence's top 2; the top (token and sequence) is what every answer
    through the balancer must be. The top must lead by a clear margin, so that batching (padding
    changes the floats by ~1e-6) can never reorder it and make a right answer look wrong."""
    expected: list[Expected] = []
    for sentence in sentences:
        body = json.dumps({"inputs": sentence, "parameters": {"top_k": 2}}).encode()
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            first, second = json.loads(response.read())
        assert first["score"] - second["score"] > 0.005, f"{sentence!r}: top answers too close to check"
        expected.append({first["token"]: first["sequence"]})
    return Workload(sentences, expected)


@dataclass
class SteadyLoad:
    """A closed loop of :data:`CLIENTS` clients, checking every answer; ``result`` once it ended."""

    result: LoadResult | None = None

    def report(self) -> str:
        r = self.result
        if r is None:
            return "the load did not end"
        return (
            f"{r.sent} requests in {r.duration_s:.1f}s: {r.correct} correct, statuses {dict(r.statuses)}, "
            f"{r.wrong} wrong; first failures: {r.failures}"
        )


@contextlib.asynccontextmanager
async def steady_load(url: str, workload: Workload, warm_up_s: float = 1.0) -> AsyncIterator[SteadyLoad]:
    """Load ``url`` until the block ends (bounded by :data:`MAX_REQUESTS` and :data:`TIME_CAP_S`)."""
    load = SteadyLoad()
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_load(
            url,
            workload.sentences,
            workload.expected,
            concurrency=CLIENTS,
            requests=MAX_REQUESTS,
            time_cap_s=TIME_CAP_S,
            stop=stop,
        )
    )
    try:
        await asyncio.sleep(warm_up_s)  # every client is sending before anything happens
        yield load
    finally:
        stop.set()
        load.result = await task


def load_figures(result: LoadResult) -> dict[str, Any]:
    """What every fleet test records of its load: sent, time, failures, statuses, tail latency."""
    return {
        "requests": result.sent,
        "seconds": round(result.duration_s, 1),
        "failed": result.failed,
        "statuses": dict(result.statuses),
        "wrong": result.wrong,
        "p99_ms": round(result.p(99), 1),
        "max_ms": round(max(result.latencies_ms), 1) if result.latencies_ms else None,
    }


def record(name: str, figures: dict[str, Any]) -> None:
    """Print a test's figures and keep them in artifacts/fleet.json (one entry per test)."""
    print(f"fleet {name}:", json.dumps(figures))
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "fleet.json"
    try:
        everything = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        everything = {}
    everything[name] = figures
    path.write_text(json.dumps(everything, indent=2) + "\n", encoding="utf-8")
