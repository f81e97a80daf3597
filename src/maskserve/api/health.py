"""Liveness and readiness, answered from the event loop: never queued behind inference.

``/livez`` asks "should this process be restarted?" Only a stuck inference thread (one batch,
of any model, holding it past the stall budget) or a dead batch loop says yes: there is one of each
whatever the number of models. The budget is a multiple of the
longest batch the limits admit, by this machine's measured costs (``Forecast.stall_budget``), so a
big request can never look like a hang, and a busy or overloaded server is alive: restarting it
would only lose its queue.

``/readyz`` asks "can this process serve?" Not while any model loads, not while it drains after
a stop signal, not while it is stuck. Never because of load: a saturated fleet whose replicas all
left their Service would answer clients with refused connections instead of a 503 with
Retry-After. Overload is answered at the door, request by request; balancers that want to steer
by load read the agent (agent.py) or the metrics.

The checks are plain functions of the scheduler's state (``service/health.py``), which the gRPC
health service answers from as well.
"""

from __future__ import annotations

from aiohttp import web

from maskserve.request.keys import service_of, state_of
from maskserve.service.health import Health, live, ready


def probe_response(request: web.Request, health: Health, failed_kind: str, failed_status: int = 503) -> web.Response:
    """The probe's answer: 200, or ``failed_status`` with the problems; never cached."""
    if not health.ok:
        state_of(request).kind = failed_kind  # for the access log and the request counter
    return web.json_response(
        health.body(),
        status=200 if health.ok else failed_status,
        # A probe's answer is about this instant; no proxy may serve it later.
        headers={"Cache-Control": "no-store"},
    )


async def livez(request: web.Request) -> web.Response:
    """``GET /livez``: 200 while the inference thread makes progress, else 503 saying why."""
    return probe_response(request, live(service_of(request.app)), "not_live")


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 while this server can serve (loaded, not draining, not stuck), else 503 saying why."""
    return probe_response(request, ready(service_of(request.app)), "not_ready")
