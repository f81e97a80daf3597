"""Several server processes on one port (``--workers N``), managed by gunicorn's arbiter.

gunicorn forks N workers; it replaces a worker that dies, and on SIGTERM it sends SIGTERM to every
worker and waits for them. Each worker listens on its own ``SO_REUSEPORT`` socket on the port, so
the kernel spreads new connections evenly across the workers: with one shared socket, the worker
that wakes first accepts a whole burst of connections at once (asyncio accepts up to its backlog
per wake-up), and a keep-alive client then sends everything to it: one worker of two got every
connection. A worker opens its socket only once its model is loaded, so no connection waits
behind a load. Each worker is a whole
maskserve: its own model (loaded after the fork: the arbiter never imports torch), queue,
inference thread, and its share of the CPUs (``Settings.resolved_threads``). A worker
follows a stop signal with the same drain as a single process (serve.py).

``/metrics`` on any worker reports the whole server: each worker also listens on a private Unix
socket in a directory only this server uses, and the worker that is scraped asks the others for
their own series (``?scope=worker``) and labels every series with its worker's slot. Slots
``0``..``N-1`` are stable: a replacement worker takes its predecessor's. The same sockets carry
the model repository's changes from worker to worker, and a worker that starts after its
siblings loads what they serve before it opens its public ports
(``request/across_workers.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from gunicorn import sock
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer
from gunicorn.workers.base import Worker

from maskserve.config.model_source import ModelLoadError
from maskserve.config.settings import Settings, SettingsError
from maskserve.http.app import create_app, grpc_context
from maskserve.middleware.auth import parse_api_keys
from maskserve.request.across_workers import INDEX_PATH, join_siblings
from maskserve.request.keys import service_of
from maskserve.server.serve import serve

log = logging.getLogger("maskserve")

# A sibling that has not answered its part of a scrape in this time is left out of it.
PEER_SCRAPE_TIMEOUT_S = 2.0
# A sibling that has not given its index in this time is counted as not answering.
PEER_INDEX_TIMEOUT_S = 10.0
# Added to --model-load-timeout for a forwarded load or unload: the answer's way back.
PEER_CHANGE_MARGIN_S = 30.0
# Seconds between heartbeats to the arbiter, which restarts a worker silent for --timeout (30 s).
HEARTBEAT_S = 2.0


class WorkerPeers:
    """This worker's slot, and its siblings through their private sockets: their metrics, and the
    model repository's changes and indexes (request/across_workers.py)."""

    def __init__(self, run_dir: Path, slot: int, settings: Settings) -> None:
        self.run_dir = run_dir
        self.worker = str(slot)
        keys = parse_api_keys(settings.api_key)
        self._headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
        # A forwarded load takes as long as the model's load may (--model-load-timeout), and a
        # margin; a sibling that has not answered by then (stopped, or hung) fails the change.
        self._change_s = settings.model_load_timeout + PEER_CHANGE_MARGIN_S

    @staticmethod
    def socket_path(run_dir: Path, slot: int) -> Path:
        return run_dir / f"worker-{slot}.sock"

    async def expositions(self) -> list[tuple[str, bytes]]:
        scrape = functools.partial(self._ask, "GET", "/metrics?scope=worker", total_s=PEER_SCRAPE_TIMEOUT_S)
        answers = await asyncio.gather(*(scrape(path) for path in self._siblings()))
        # A worker starting, draining or dead: its series are missing from this scrape.
        return [(slot, body) for slot, status, body in answers if status == 200]

    async def forward(self, path: str, body: bytes, headers: dict[str, str]) -> list[tuple[str, int, bytes]]:
        # The index answers at once; a load takes as long as its model does.
        total_s = PEER_INDEX_TIMEOUT_S if path == INDEX_PATH else self._change_s
        ask = functools.partial(self._ask, "POST", path, data=body, headers=headers, total_s=total_s)
        return list(await asyncio.gather(*(ask(sibling) for sibling in self._siblings())))

    def _siblings(self) -> list[Path]:
        return sorted(p for p in self.run_dir.glob("worker-*.sock") if p.stem != f"worker-{self.worker}")

    async def _ask(
        self,
        method: str,
        route: str,
        sibling: Path,
        *,
        total_s: float | None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[str, int, bytes]:
        """One request to a sibling over its private socket: (its slot, status, body); status 0 for
        a sibling that did not answer (starting, draining or dead)."""
        slot = sibling.stem.removeprefix("worker-")
        timeout = aiohttp.ClientTimeout(total=total_s, sock_connect=PEER_SCRAPE_TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sibling)), timeout=timeout) as session,
                session.request(
                    method, f"http://worker{route}", data=data, headers={**self._headers, **(headers or {})}
                ) as reply,
            ):
                return slot, reply.status, await reply.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return slot, 0, b""


class MaskserveWorker(Worker):  # type: ignore[misc]
    """A gunicorn worker that runs one whole maskserve (every model) on its own SO_REUSEPORT socket."""

    sockets: list[Any]  # gunicorn's listeners; .sock is the socket

    def load_wsgi(self) -> None:
        # gunicorn opened this worker's SO_REUSEPORT socket at the fork: close it while the models
        # load (in the app's start-up, the one load path every model takes), or the kernel would
        # queue connections on it that nothing accepts yet. It opens again once they serve.
        sock.close_sockets(self.sockets, unlink=False)
        self.sockets = []

    def _public_sockets(self) -> list[socket.socket]:
        self.sockets = sock.create_sockets(self.cfg, self.log)
        return [s.sock for s in self.sockets]

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        settings: Settings = self.app.settings
        app = create_app(settings)
        slot: int = self.slot
        service_of(app).peers = WorkerPeers(self.app.run_dir, slot, settings)
        private = WorkerPeers.socket_path(self.app.run_dir, slot)
        private.unlink(missing_ok=True)  # a dead predecessor's
        # A worker that starts after its siblings (late, or in place of a dead one) serves what
        # they serve before it takes a connection: once in the app's start-up, before the gRPC
        # port opens; and again once its private socket is open (from then on every change
        # reaches it), for what changed in between, before the public port opens.
        contexts = app.cleanup_ctx
        contexts.insert(contexts.index(grpc_context) if grpc_context in contexts else len(contexts), _joined)
        from maskserve.engine import BackendUnavailable  # after the fork: the arbiter never imports torch

        # The arbiter restarts a worker silent for its --timeout: the loop keeps beating while the
        # models load on threads of their own.
        heartbeat = asyncio.create_task(self._heartbeat(app))
        try:
            await serve(app, sockets=self._public_sockets, private_socket=private, before_public=_join)
        except (ModelLoadError, BackendUnavailable, SettingsError) as exc:
            log.error("cannot start: %s", exc)
            # A model that cannot be served: WORKER_BOOT_ERROR, so that the arbiter stops rather
            # than restart it for ever (the server exits 1); a backend that cannot serve it or a
            # setting the models cannot live with: APP_LOAD_ERROR (exit 2), as a single process.
            sys.exit(Arbiter.WORKER_BOOT_ERROR if isinstance(exc, ModelLoadError) else Arbiter.APP_LOAD_ERROR)
        finally:
            heartbeat.cancel()

    async def _heartbeat(self, app: web.Application) -> None:
        while True:
            self.notify()
            if self.ppid != os.getppid():  # the arbiter died: stop as on SIGTERM, no one restarts us
                log.warning("the worker's arbiter is gone; stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            await asyncio.sleep(HEARTBEAT_S)


async def _joined(app: web.Application) -> AsyncIterator[None]:
    await _join(app)
    yield


async def _join(app: web.Application) -> None:
    await join_siblings(service_of(app))


class WorkersApplication(BaseApplication):  # type: ignore[misc]
    """gunicorn configured from maskserve's settings (no gunicorn command line, no config file)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # The workers' private sockets; removed when the arbiter exits.
        self.run_dir = Path(tempfile.mkdtemp(prefix="maskserve-workers-"))
        super().__init__()

    def load_config(self) -> None:
        settings = self.settings
        config: dict[str, Any] = {
            "bind": f"{settings.host}:{settings.port}",
            "workers": settings.workers,
            # One listening socket per worker, the kernel balancing connections (module docstring).
            "reuse_port": True,
            "worker_class": f"{__name__}.MaskserveWorker",
            # SIGTERM to the arbiter: each worker drains (--drain-delay, then --drain-timeout);
            # only a worker still running after both and a margin is killed.
            "graceful_timeout": math.ceil(settings.drain_delay + settings.drain_timeout) + 5,
            "loglevel": settings.log_level,
            "errorlog": "-",
            "accesslog": None,  # each worker writes maskserve's own access line
            "proc_name": "maskserve",
            "pre_fork": _assign_slot,
            "on_exit": lambda arbiter: shutil.rmtree(self.run_dir, ignore_errors=True),
        }
        if "control_socket_disable" in self.cfg.settings:
            # gunicorn 24+'s control socket would write to $HOME (read-only in a hardened pod);
            # maskserve takes no runtime commands.
            config["control_socket_disable"] = True
        for key, value in config.items():
            self.cfg.set(key, value)

    def load(self) -> None:  # the workers build their own app after the fork (MaskserveWorker)
        return None


def _assign_slot(arbiter: Arbiter, worker: MaskserveWorker) -> None:
    """The lowest slot no live worker holds: a replacement takes its predecessor's label."""
    taken = {getattr(w, "slot", None) for w in arbiter.WORKERS.values()}
    worker.slot = next(slot for slot in range(arbiter.num_workers + len(taken)) if slot not in taken)


def _check_port(host: str, port: int) -> None:
    """Raise OSError now if the workers could not listen: the arbiter binds nothing itself, and a
    worker that cannot bind would be replaced for ever."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        probe.bind((host, port))


def run_workers(settings: Settings) -> int:
    """Serve with ``settings.workers`` processes until stopped; the exit status."""
    # The HTTP port, and the gRPC port when on: every worker binds both (with SO_REUSEPORT).
    for port in (settings.port, settings.grpc_port) if settings.grpc_port else (settings.port,):
        try:
            _check_port(settings.host, port)
        except OSError as exc:
            # A setting that cannot be used here: exit 2, as a single process does.
            log.error("cannot start: cannot listen on %s:%d (%s)", settings.host, port, exc.strerror or exc)
            return 2
    arbiter = os.getpid()
    try:
        WorkersApplication(settings).run()
    except SystemExit as exc:
        if os.getpid() != arbiter:
            raise  # a forked worker leaving with its own status, through the arbiter's frames
        return _exit_status(exc.code)
    except HaltServer as halt:
        # A second worker failing to boot while the arbiter halts for the first escapes gunicorn's
        # own handling; the workers have logged why.
        return _exit_status(halt.exit_status)
    return 0


def _exit_status(halted_with: object) -> int:
    """maskserve's exit status for the one gunicorn halted with, as a single process would exit:
    3, a worker could not boot (the model cannot be served), is 1; 4, the backend cannot serve the
    model, is 2; any other failure is 1. The workers have logged why."""
    if halted_with in (None, 0):
        return 0
    return 2 if halted_with == Arbiter.APP_LOAD_ERROR else 1
