"""The typed keys: the service on the app, each request's own record on the request. Declared here, once.

Everything the request path shares is reached through these two (the tracing stage keeps its own
on the app, beside the SDK it needs): a handler, a stage or a probe takes what it needs from the
service, and what it learns about its request goes in the record.
"""

from __future__ import annotations

from aiohttp import web

from maskserve.request.state import RequestState
from maskserve.service.registry import FillMaskService

SERVICE_KEY = web.AppKey("service", FillMaskService)
REQUEST_KEY = web.RequestKey("state", RequestState)


def service_of(app: web.Application) -> FillMaskService:
    """The app's service."""
    return app[SERVICE_KEY]


def state_of(request: web.BaseRequest) -> RequestState:
    """The request's own record, made on first use."""
    state = request.get(REQUEST_KEY)
    if state is None:
        state = request[REQUEST_KEY] = RequestState()
    return state
