"""CORS: off unless ``--cors-origins`` names the sites whose pages may call this server.

It sits outside the error sanitizer so that its headers reach error responses too: without
``Access-Control-Allow-Origin`` a browser hides a 503 and its ``Retry-After`` from the calling
page. It raises nothing itself. Preflights from allowed origins are answered here, before
authentication, because browsers never send credentials on a preflight. A request from any other
origin gets no CORS header at all, so the browser keeps the answer from the calling page.
"""

from __future__ import annotations

from collections.abc import Collection

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

ALLOWED_METHODS = "GET, POST"
# What a page may send: the key, JSON, and the headers maskserve reads.
ALLOWED_HEADERS = "Authorization, Content-Type, X-Request-Id, X-Request-Timeout"
# What a page may read besides the CORS-safelisted headers: back-off and timing.
EXPOSED_HEADERS = "Retry-After, X-Request-Id, X-Queue-Time-Ms, X-Inference-Time-Ms, X-Batch-Size"
# Browsers cache a preflight this many seconds (Chromium caps it at 7200).
PREFLIGHT_MAX_AGE = "600"
ANY_ORIGIN = "*"


def parse_origins(text: str) -> frozenset[str]:
    """The origins of ``--cors-origins`` (already checked by the settings); empty = CORS off."""
    return frozenset(origin.strip() for origin in text.split(",") if origin.strip())


def _allow(headers: CIMultiDict[str], allowed: str, any_origin: bool) -> None:
    headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = allowed
    if not any_origin:
        # The answer differs by origin: a shared cache must not hand one site's answer to another.
        headers.add(hdrs.VARY, "Origin")


def cors_middleware(origins: Collection[str]) -> Middleware:
    """A middleware answering preflights and adding CORS headers for ``origins`` (``*``: any)."""
    if not origins:
        raise ValueError("cors_middleware needs at least one origin")  # this is a bug: the chain checks
    any_origin = ANY_ORIGIN in origins
    allowed_origins = frozenset(origins)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or not (any_origin or origin in allowed_origins):
            return await handler(request)
        allowed = ANY_ORIGIN if any_origin else origin
        if request.method == hdrs.METH_OPTIONS and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers:
            preflight = web.Response(status=204)
            _allow(preflight.headers, allowed, any_origin)
            preflight.headers[hdrs.ACCESS_CONTROL_ALLOW_METHODS] = ALLOWED_METHODS
            preflight.headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = ALLOWED_HEADERS
            preflight.headers[hdrs.ACCESS_CONTROL_MAX_AGE] = PREFLIGHT_MAX_AGE
            return preflight
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # redirects: the error middleware lets them through
            _allow(exc.headers, allowed, any_origin)
            raise
        if not response.prepared:  # a streamed response has sent its headers already
            _allow(response.headers, allowed, any_origin)
            response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSED_HEADERS
        return response

    return cors
