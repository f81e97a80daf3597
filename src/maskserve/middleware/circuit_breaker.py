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
from maskserve.request.run_task import admit_at_door, model_for_work


@web.middleware
async def circuit_breaker_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.match_info.route.name in service_of(request.app).routes.inference:
        # The model first: with on-demand control, one not loaded yet loads here, in the deadline.
        admit_at_door(request, await model_for_work(request))
    return await handler(request)
