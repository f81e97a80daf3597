"""Liveness and readiness, answered from the event loop: never queued behind inference.

``/livez`` asks "should this process be restarted?" Only a stuck inference thread (one forward
pass running past ``--stall-timeout``) or a dead batch loop says yes: a busy or overloaded server
is alive, and restarting it would only lose its queue (TGI#3241). ``/readyz`` asks "should work
be sent here now?" Not while loading or draining, and not once a new request with the default
deadline would be refused at the door: the probe flips *before* clients see 503s.

The checks are plain functions of the batcher's state, so tests drive them without HTTP.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web

from .batcher import Batcher
from .keys import BATCH_LOOP_KEY, BATCHER_KEY, ERROR_KIND_KEY, LIFECYCLE_KEY, SETTINGS_KEY
from .lifecycle import Lifecycle


@dataclass(frozen=True)
class Problem:
    """One reason a probe fails: a stable ``code`` for scripts and a ``message`` for people."""

    code: str
    message: str


@dataclass(frozen=True)
class Health:
    """A probe's verdict: healthy when there is no problem; ``facts`` are what it looked at."""

    problems: tuple[Problem, ...] = ()
    facts: dict[str, float | int | bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def body(self) -> dict[str, object]:
        return {
            "status": "ok" if self.ok else "unavailable",
            "problems": [{"code": p.code, "message": p.message} for p in self.problems],
            **self.facts,
        }


def liveness(batcher: Batcher | None, batch_loop: asyncio.Task[None] | None, stall_timeout: float) -> Health:
    """Alive unless a forward pass has run longer than ``stall_timeout`` or the batch loop died."""
    if batcher is None:
        # Still loading the model: alive, just not ready.
        return Health(facts={"loaded": False})
    problems: list[Problem] = []
    busy_for = batcher.busy_for
    if busy_for > stall_timeout:
        problems.append(
            Problem(
                "stalled",
                f"a forward pass has been running for {busy_for:.1f}s, "
                f"longer than the stall budget of {stall_timeout:g}s (--stall-timeout)",
            )
        )
    if batch_loop is not None and batch_loop.done() and not batcher.closed:
        # The loop only ends when the app stops; ending earlier means it crashed (a bug), and
        # nothing queued will ever run again.
        problems.append(Problem("batch_loop_stopped", "the batch loop has stopped; no queued request will run"))
    return Health(
        tuple(problems),
        {
            "loaded": True,
            "busy": batcher.busy,
            "busy_for_s": round(busy_for, 3),
            "since_progress_s": round(time.monotonic() - batcher.last_progress, 3),
            "batches_run": batcher.batches_run,
            "stall_timeout_s": stall_timeout,
        },
    )


def readiness(
    batcher: Batcher | None, live: Health, request_timeout: float, lifecycle: Lifecycle | None = None
) -> Health:
    """Ready when the model is loaded, the server is not draining and a new request would be admitted now.

    The admission test is the circuit breaker's, for a request with the default deadline
    (``request_timeout``): the predicted wait for one more text must fit in it, and the queue
    must have room.
    """
    if batcher is None:
        return Health((Problem("loading", "the model is still loading"),), {"loaded": False})
    problems = list(live.problems)
    if batcher.closed:
        problems.append(Problem("draining", "the server is shutting down and accepts no new work"))
    elif lifecycle is not None and lifecycle.draining:
        # Still answering (the drain delay): this probe failing is what tells balancers to stop.
        problems.append(Problem("draining", "the server is shutting down; send new work elsewhere"))
    if batcher.is_full():
        problems.append(
            Problem("queue_full", f"the queue is full ({batcher.depth} of {batcher.limits.max_queue} texts)")
        )
    predicted = batcher.predicted_wait(extra_texts=1)
    if predicted > request_timeout:
        problems.append(
            Problem(
                "predicted_timeout",
                f"a new request would wait about {predicted:.1f}s, "
                f"over the default deadline of {request_timeout:g}s (--request-timeout)",
            )
        )
    return Health(
        tuple(problems),
        {
            "loaded": True,
            "queue_depth": batcher.depth,
            "max_queue": batcher.limits.max_queue,
            "predicted_wait_s": round(predicted, 3),
            "request_timeout_s": request_timeout,
        },
    )


def probe_response(request: web.Request, health: Health, failed_kind: str, failed_status: int = 503) -> web.Response:
    """The probe's answer: 200, or ``failed_status`` with the problems; never cached."""
    if not health.ok:
        request[ERROR_KIND_KEY] = failed_kind  # for the access log and the request counter
    return web.json_response(
        health.body(),
        status=200 if health.ok else failed_status,
        # A probe's answer is about this instant; no proxy may serve it later.
        headers={"Cache-Control": "no-store"},
    )


def live(app: web.Application) -> Health:
    """The app's liveness now."""
    return liveness(app.get(BATCHER_KEY), app.get(BATCH_LOOP_KEY), app[SETTINGS_KEY].stall_timeout)


def ready(app: web.Application) -> Health:
    """The app's readiness now (liveness problems included)."""
    return readiness(app.get(BATCHER_KEY), live(app), app[SETTINGS_KEY].request_timeout, app[LIFECYCLE_KEY])


async def livez(request: web.Request) -> web.Response:
    """``GET /livez``: 200 while the inference thread makes progress, else 503 saying why."""
    return probe_response(request, live(request.app), "not_live")


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 when a new request would be accepted now, else 503 saying why."""
    return probe_response(request, ready(request.app), "not_ready")
