"""Circuit breaking at the door: refuse inference requests before their body is read.

A thin adapter over the service's admission (``admission.py``, through ``run_task.admit_at_door``,
which the demo page's form asks too). Only the routes the route table marks as inference routes
(``RouteRoles.inference``, on the service) are ever refused: health, metrics, info and the page's
GET always pass.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from maskserve.request.keys import service_of
from maskserve.request.run_task import admit_at_door, held_for_work


@web.middleware
async def circuit_breaker_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.match_info.route.name not in service_of(request.app).routes.inference:
        return await handler(request)
    # The model first: with on-demand control, one not loaded yet loads here, in the deadline. It
    # is held from here to the answer, before the body is read, so that a reload in between
    # cannot take it away from a request it accepted.
    async with held_for_work(request) as served:
        admit_at_door(request, served)
        return await handler(request)
