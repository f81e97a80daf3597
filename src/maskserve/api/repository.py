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
every worker (undone where it loaded if it fails on any), and the index is the same from any of
them (:mod:`maskserve.request.across_workers`).
"""

from __future__ import annotations

from typing import Any

import jsonschema
from aiohttp import hdrs, web

from maskserve.middleware.auth import check_control_key, presented_key
from maskserve.request.across_workers import (
    ACTOR_HEADER,
    CHANGE_HEADER,
    UNDO_HEADER,
    forwarded,
    load_everywhere,
    merged_index,
    own_index,
    unload_everywhere,
)
from maskserve.request.keys import service_of, state_of
from maskserve.request.model_repository import checked_name, control_of, entry_json, load_overrides
from maskserve.request.run_task import read_body
from maskserve.request.worker_loads import load_here, undo_here, unload_here
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
    service = service_of(request.app)
    control = control_of(service)
    ready = bool((await _json_body(request, INDEX_SCHEMA)).get("ready"))
    if forwarded(request):  # a sibling's question: this worker's own index, with its load configs
        return web.json_response(own_index(service, control, ready))
    entries = [entry_json(entry) for entry in control.index(ready_only=ready)]
    if service.peers is not None:
        entries = await merged_index(service.peers, entries, ready)
    return web.json_response(entries)


async def load(request: web.Request) -> web.Response:
    """``POST /v2/repository/models/{model}/load``: load it (or reload it) and answer once it serves."""
    service = service_of(request.app)
    control = control_of(service)
    _check_control_key(request)
    name = checked_name(control, request.match_info["model"])
    body = await _json_body(request, CHANGE_SCHEMA)
    overrides = load_overrides(name, body.get("parameters") or {})
    if forwarded(request):  # this worker's part of a sibling's change; it says whether it was fresh
        change = request.headers.get(CHANGE_HEADER, state_of(request).id)
        fresh = await load_here(service, control, name, overrides, change=change, actor=_actor(request))
        return web.json_response({"fresh": fresh})
    await load_everywhere(
        service,
        control,
        name,
        overrides,
        body=await request.read(),
        authorization=request.headers.get(hdrs.AUTHORIZATION),
        actor=_actor(request),
        change=state_of(request).id,
    )
    return web.Response(status=200)


async def unload(request: web.Request) -> web.Response:
    """``POST /v2/repository/models/{model}/unload``: answer what it accepted, then release it."""
    service = service_of(request.app)
    control = control_of(service)
    _check_control_key(request)
    name = checked_name(control, request.match_info["model"])
    await _json_body(request, CHANGE_SCHEMA)  # unload_dependents: a maskserve model has none
    if forwarded(request):
        undo = request.headers.get(UNDO_HEADER)
        if undo is not None:  # a load that failed on another worker: undone where it loaded afresh
            await undo_here(service, control, name, undo)
        else:
            await unload_here(control, name, actor=_actor(request))
        return web.Response(status=200)
    await unload_everywhere(
        service,
        control,
        name,
        authorization=request.headers.get(hdrs.AUTHORIZATION),
        actor=_actor(request),
        change=state_of(request).id,
    )
    return web.Response(status=200)


def _check_control_key(request: web.Request) -> None:
    check_control_key(service_of(request.app).settings.control_key, presented_key(request))


def _actor(request: web.Request) -> str:
    """Who asked, for the log: the client's address and the request's id (never a key); for a
    change a sibling worker forwarded over its private socket, whom it names. A public client's
    actor header is never read."""
    if forwarded(request):
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
