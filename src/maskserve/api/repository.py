"""The Open Inference Protocol's model repository extension, as Triton writes it over REST.

    POST /v2/repository/index                     every model, its version, state and reason
                                                  (``{"ready": true}``: the ready ones only)
    POST /v2/repository/models/{model}/load       load or reload (``parameters.config``: a JSON
                                                  object of the model's own settings, applied over
                                                  its settings file's)
    POST /v2/repository/models/{model}/unload     unload, once what it accepted is answered

The index needs the API key, as every other route does; load and unload need the control key
(``--control-key``), which the API key does not grant, and are logged with who asked. With
``--model-control-mode none`` the extension is off: the three routes answer 404, as on a server
without it, and server metadata does not list it. With ``--workers``, a load or unload applies to
every worker, and the index is the same from any of them (:mod:`maskserve.request.model_repository`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema
from aiohttp import hdrs, web

from maskserve.middleware.auth import check_control_key, presented_key
from maskserve.request.keys import service_of, state_of
from maskserve.request.model_repository import (
    ACTOR_HEADER,
    PEER_HEADER,
    control_of,
    entry_json,
    everywhere,
    load_overrides,
    merged_index,
)
from maskserve.request.run_task import read_body
from maskserve.tasks.request_checks import load_json, schema_error

# The protocol's bodies: every member optional, as Triton's clients may send none at all.
INDEX_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"repository_name": {"type": "string"}, "ready": {"type": "boolean"}},
}
CHANGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"parameters": {"type": "object"}},
}


async def index(request: web.Request) -> web.Response:
    """``POST /v2/repository/index``: every model this server may serve, with its state."""
    control = control_of(service_of(request.app))
    body = await _json_body(request, INDEX_SCHEMA)
    entries = [entry_json(entry) for entry in control.index(ready_only=bool(body.get("ready")))]
    peers = service_of(request.app).peers
    if peers is not None and PEER_HEADER not in request.headers:
        entries = await merged_index(peers, entries, bool(body.get("ready")))
    return web.json_response(entries)


async def load(request: web.Request) -> web.Response:
    """``POST /v2/repository/models/{model}/load``: load it (or reload it) and answer once it serves."""
    control = control_of(service_of(request.app))
    _check_control_key(request)
    name = request.match_info["model"]
    body = await _json_body(request, CHANGE_SCHEMA)
    overrides = load_overrides(name, body.get("parameters") or {})

    async def here() -> None:
        await control.load(name, overrides, actor=_actor(request))

    await _everywhere(request, here)
    return web.Response(status=200)


async def unload(request: web.Request) -> web.Response:
    """``POST /v2/repository/models/{model}/unload``: answer what it accepted, then release it."""
    control = control_of(service_of(request.app))
    _check_control_key(request)
    name = request.match_info["model"]
    await _json_body(request, CHANGE_SCHEMA)  # unload_dependents: a maskserve model has none

    async def here() -> None:
        await control.unload(name, actor=_actor(request))

    await _everywhere(request, here)
    return web.Response(status=200)


async def _everywhere(request: web.Request, here: Callable[[], Awaitable[None]]) -> None:
    service = service_of(request.app)
    body = await request.read()
    forwarded = PEER_HEADER in request.headers
    authorization = request.headers.get(hdrs.AUTHORIZATION)
    await everywhere(service, request.path, body, authorization, here, actor=_actor(request), forwarded=forwarded)


def _check_control_key(request: web.Request) -> None:
    check_control_key(service_of(request.app).settings.control_key, presented_key(request))


def _actor(request: web.Request) -> str:
    """Who asked, for the log: the client's address and the request's id (never a key); for a
    change a sibling worker forwarded, whom it names."""
    if PEER_HEADER in request.headers:
        return f"{request.headers.get(ACTOR_HEADER, 'a client')}, through a sibling worker"
    return f"{request.remote or 'a client'} (request {state_of(request).id})"


async def _json_body(request: web.Request, schema: dict[str, Any]) -> dict[str, Any]:
    """The body as JSON of ``schema``; an empty body is an empty object, as Triton's clients send.
    Read and checked as every other JSON body is (its depth bounded, a 422 naming the field)."""
    raw = await read_body(request)
    if not raw.strip():
        return {}
    body = load_json(raw, service_of(request.app).settings.max_json_depth)
    try:
        jsonschema.validate(body, schema)
    except jsonschema.ValidationError as exc:
        raise schema_error(exc) from None
    return dict(body)
