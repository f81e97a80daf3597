"""The Open Inference Protocol ("KServe v2"), as its REST specification writes it.

    GET  /v2, /v2/                                   server metadata
    GET  /v2/health/live                             200 while /livez would be; 400 otherwise (the protocol's 4xx)
    GET  /v2/health/ready                            200 while /readyz would be; 400 otherwise
    GET  /v2/models/{model}[/versions/{version}]         model metadata: a BYTES input "text", a BYTES output
    GET  /v2/models/{model}[/versions/{version}]/ready   as /v2/health/ready, and 400 too while that model
                                                     does not serve (unknown, not loaded, loading), as Triton
    POST /v2/models/{model}[/versions/{version}]/infer   fill-mask (output "predictions") or scoring (output
                                                     "scores") through the same parsers, admission and batcher

``{model}`` is any served model's name and ``{version}`` is ``1``, the one version served (model
metadata lists it); any other name or version is a 404 in maskserve's error shape, whose ``error``
string is what the protocol's clients read (the ready route's "no" is its 400). Every model route
answers with and without the version segment, as the specification lists them and as clients that
pass a version (``tritonclient``'s ``model_version``, KServe's) call them. The tensors' form is in oip_tensors.py.
"""

from __future__ import annotations

from aiohttp import web

from maskserve.api.health import probe_response
from maskserve.request.deadlines import request_deadline
from maskserve.request.keys import service_of, state_of
from maskserve.request.oip_model import (
    check_version,
    infer_parser,
    model_metadata_of,
    model_readiness,
    run_infer,
    server_metadata_of,
)
from maskserve.request.run_task import model_for_work, read_body, served_model, timing_headers, windows_header
from maskserve.service.health import live, ready
from maskserve.service.served_model import ServedModel
from maskserve.tasks.oip_tensors import HEADER_LENGTH, infer_response

# The protocol says a failed health check is a 4xx; Triton answers 400, and so does maskserve.
NOT_HEALTHY = 400


def _served_model(request: web.Request) -> tuple[ServedModel, str | None]:
    """The served model (and version, when the path names one) the path asks for; a 404 naming what
    is served otherwise."""
    served = served_model(request)
    version = request.match_info.get("version")
    check_version(served, version)
    return served, version


async def server_metadata(request: web.Request) -> web.Response:
    """``GET /v2`` and ``GET /v2/``: who serves, and which protocol extensions."""
    return web.json_response(server_metadata_of(service_of(request.app)))


async def server_live(request: web.Request) -> web.Response:
    return probe_response(request, live(service_of(request.app)), "not_live", failed_status=NOT_HEALTHY)


async def server_ready(request: web.Request) -> web.Response:
    return probe_response(request, ready(service_of(request.app)), "not_ready", failed_status=NOT_HEALTHY)


async def model_ready(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}[/versions/{version}]/ready``: 200 while the server is ready and the
    model serves; otherwise 400 with the problems, for a model unknown, not loaded or loading too,
    as Triton answers (its clients' ``is_model_ready()`` then returns False)."""
    served, health = model_readiness(
        service_of(request.app), request.match_info.get("model"), request.match_info.get("version")
    )
    if served is not None:
        state = state_of(request)
        state.served, state.model = served, served.name
    return probe_response(request, health, "not_ready", failed_status=NOT_HEALTHY)


async def model_metadata(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}``: the model's tensors: texts in, predictions or scores (JSON) out."""
    served, _ = _served_model(request)
    return web.json_response(model_metadata_of(served))


async def infer(request: web.Request) -> web.Response:
    """``POST /v2/models/{model}/infer``: texts in, each text's predictions (or scores) out, as
    ``POST /`` (or ``POST /score``) would answer."""
    served = await model_for_work(request)
    version = request.match_info.get("version")
    check_version(served, version)
    request_deadline(request)
    envelope = infer_parser(served).parse(await read_body(request), request.headers.get(HEADER_LENGTH))
    inferred = await run_infer(state_of(request), served, envelope)
    payload, headers = infer_response(served.name, envelope, inferred.texts_json, version=version)
    return web.Response(
        body=payload, headers={**headers, **timing_headers(inferred.rows), **windows_header(inferred.windows)}
    )
