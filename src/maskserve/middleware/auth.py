"""Bearer-token authentication: with ``--api-key`` set, all but health and the page need the key.

Open without a key: the routes the route table marks public (``RouteRoles.public``, on the app's
state): ``/livez`` and ``/readyz`` (probes cannot be expected to hold secrets), and the demo
page's ``GET /`` with its static files and the ``GET /demo`` redirect (they run nothing).
Everything else needs ``Authorization: Bearer <key>``: ``POST /`` and the page's ``POST /demo``,
``/info`` and ``/metrics`` (they describe the deployment), and unknown paths, so that a caller
without the key cannot even map the routes. A missing or wrong key answers 401 ``unauthorized``
with ``WWW-Authenticate: Bearer``. The model repository's load and unload routes need the
control key instead (``--control-key``), which their handler checks.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from maskserve.errors import Forbidden, Unauthorized
from maskserve.request.keys import service_of


def parse_api_keys(text: str | None) -> tuple[str, ...]:
    """The keys in ``--api-key``: comma-separated, so a new key can be rolled out before the old one goes."""
    if not text:
        return ()
    return tuple(key.strip() for key in text.split(",") if key.strip())


def presented_key(request: web.Request) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive), or None."""
    scheme, _, token = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token.encode("utf-8", "surrogateescape")


def key_matches(given: bytes, keys: Sequence[bytes]) -> bool:
    """Whether ``given`` is one of ``keys``, compared in constant time.

    Every key is compared, each with :func:`hmac.compare_digest`, so neither the time taken nor
    which key matched tells a caller how close a guess was.
    """
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given, key)
    return matched


def check_control_key(control_key: str | None, given: bytes | None) -> None:
    """The model control routes' and RPCs' key, and only it: 401 without a key, 403 with another
    (the API key too), 403 when the server has no control key at all."""
    keys = parse_api_keys(control_key)
    if not keys:
        raise Forbidden("model control is off here: start the server with --control-key to load and unload models")
    if given is None:
        raise Unauthorized("loading and unloading models needs the control key: send Authorization: Bearer <key>")
    if not key_matches(given, tuple(key.encode("utf-8") for key in keys)):
        raise Forbidden("this key does not grant model control (the API key does not: send the control key)")


def auth_middleware(api_keys: Sequence[str]) -> Middleware:
    """A middleware refusing, with 401, requests to protected routes without one of ``api_keys``."""
    if not api_keys:
        raise ValueError("auth_middleware needs at least one key")  # this is a bug: the chain checks
    keys = tuple(key.encode("utf-8") for key in api_keys)

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        routes = service_of(request.app).routes
        name = request.match_info.route.name
        # Control routes check the control key themselves (the API key does not grant them).
        if name in routes.public or name in routes.control:
            return await handler(request)
        given = presented_key(request)
        if given is None:
            raise Unauthorized("this server needs an API key: send Authorization: Bearer <key>")
        if not key_matches(given, keys):
            raise Unauthorized("the API key is not valid", invalid_token=True)
        return await handler(request)

    return auth
