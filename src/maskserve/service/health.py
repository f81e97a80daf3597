"""Liveness and readiness as plain functions of the service's state: no HTTP, no gRPC.

``/livez``, ``/readyz``, the protocol's health routes (``api/``) and the gRPC health service
(``rpc/``) all answer from these, on the event loop, never queued behind inference. Why each
check is what it is: ``api/health.py``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from maskserve.service.lifecycle import Lifecycle
from maskserve.service.registry import FillMaskService
from maskserve.serving.costs import ONE_TEXT
from maskserve.serving.scheduler import Scheduler


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


def liveness(scheduler: Scheduler | None, batch_loop: asyncio.Task[None] | None, stall_floor: float) -> Health:
    """Alive unless a batch has held the inference thread past the stall budget or the batch loop died."""
    if scheduler is None:
        # Still loading the models: alive, just not ready.
        return Health(facts={"loaded": False})
    problems: list[Problem] = []
    busy_for = scheduler.busy_for
    budget = scheduler.stall_budget(stall_floor)
    if busy_for > budget:
        problems.append(
            Problem(
                "stalled",
                f"one batch has held the inference thread for {busy_for:.1f}s, longer than the stall "
                f"budget of {budget:.1f}s (four times the longest batch the limits admit, at least "
                f"--stall-timeout {stall_floor:g}s)",
            )
        )
    if batch_loop is not None and batch_loop.done() and not scheduler.closed:
        # The loop only ends when the app stops; ending earlier means it crashed (a bug), and
        # nothing queued will ever run again.
        problems.append(Problem("batch_loop_stopped", "the batch loop has stopped; no queued request will run"))
    return Health(
        tuple(problems),
        {
            "loaded": True,
            "busy": scheduler.in_flight is not None,
            "busy_for_s": round(busy_for, 3),
            "since_progress_s": round(time.monotonic() - scheduler.last_progress, 3),
            "batches_run": scheduler.batches_run,
            "stall_budget_s": round(budget, 3),
        },
    )


def readiness(scheduler: Scheduler | None, live: Health, lifecycle: Lifecycle | None = None) -> Health:
    """Ready when every model is loaded, the server is not draining and it is alive; load is no
    part of it (see the module docstring), though the facts show it to whoever looks: texts queued
    and the queues' bounds over every model, and the longest predicted wait of any."""
    if scheduler is None:
        return Health((Problem("loading", "the models are still loading"),), {"loaded": False})
    problems = list(live.problems)
    if scheduler.closed:
        problems.append(Problem("draining", "the server is shutting down and accepts no new work"))
    elif lifecycle is not None and lifecycle.draining:
        # Still answering (the drain delay): this probe failing is what tells balancers to stop.
        problems.append(Problem("draining", "the server is shutting down; send new work elsewhere"))
    return Health(
        tuple(problems),
        {
            "loaded": True,
            "queue_depth": scheduler.depth,
            "max_queue": sum(lane.settings.max_queue for lane in scheduler.lanes),
            "predicted_wait_s": round(max((lane.predicted_wait(ONE_TEXT) for lane in scheduler.lanes), default=0.0), 3),
        },
    )


def live(service: FillMaskService) -> Health:
    """The service's liveness now."""
    loaded = service.loaded
    if loaded is None:
        return liveness(None, None, service.settings.stall_timeout)
    return liveness(loaded.scheduler, loaded.batch_loop, service.settings.stall_timeout)


def ready(service: FillMaskService) -> Health:
    """The service's readiness now (liveness problems included)."""
    loaded = service.loaded
    return readiness(loaded.scheduler if loaded is not None else None, live(service), service.lifecycle)
