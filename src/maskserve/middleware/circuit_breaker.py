"""Circuit breaking at the door: refuse inference requests before their body is read.

A thin adapter over :class:`maskserve.breaker.CircuitBreaker`. Only the routes the route table
marks as inference routes (``RouteRoles.inference``, on the app's state) are ever refused: health,
metrics, info and the page's GET always pass.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler

from ..deadlines import request_deadline
from ..keys import BREAKER_KEY, ROUTE_ROLES_KEY


@web.middleware
async def circuit_breaker_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    route = request.match_info.route
    if route.name in request.app[ROUTE_ROLES_KEY].inference:
        # The deadline is fixed here, at the door, so the time spent reading the body counts.
        time_left = request_deadline(request) - asyncio.get_running_loop().time()
        request.app[BREAKER_KEY].check(time_left)
    return await handler(request)
