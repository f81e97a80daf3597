"""The Open Inference Protocol ("KServe v2"), as its REST specification writes it.

    GET  /v2, /v2/                                   server metadata
    GET  /v2/health/live                             200 while /livez would be; 400 otherwise (the protocol's 4xx)
    GET  /v2/health/ready                            200 while /readyz would be; 400 otherwise
    GET  /v2/models/{model}[/versions/{version}]         model metadata: a BYTES input "text", a BYTES output
    GET  /v2/models/{model}[/versions/{version}]/ready   as /v2/health/ready, for the one model served
    POST /v2/models/{model}[/versions/{version}]/infer   fill-mask through the same parser, admission and batcher

``{model}`` is any served model's name and ``{version}`` is ``1``, the one version served (model
metadata lists it); any other name or version is a 404 in maskserve's error shape, whose ``error``
string is what the protocol's clients read. Every model route answers with and without the version
segment, as the specification lists them and as clients that pass a version (``tritonclient``'s
``model_version``, KServe's) call them. The tensors' form is in oip_tensors.py.
"""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web

from maskserve import __version__
from maskserve.api.health import live, probe_response, ready
from maskserve.api.oip_tensors import (
    DATATYPE,
    HEADER_LENGTH,
    INPUT_NAME,
    OUTPUT_NAME,
    InferRequest,
    InferRequestParser,
    infer_response,
)
from maskserve.errors import NotFound
from maskserve.model_api import describe_model
from maskserve.request.keys import service_of
from maskserve.request.run_task import read_body, run_task, served_model, timing_headers, windows_header
from maskserve.service.registry import ServedModel
from maskserve.tasks.fill_mask_request import FillMaskRequest

# The protocol says a failed health check is a 4xx; Triton answers 400, and so does maskserve.
NOT_HEALTHY = 400
# The protocol's platform names for what runs the model (its "Platforms" list has no eager PyTorch).
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "openvino": "openvino"}


# The one version of the model this server serves: model metadata lists it, and a path may name it.
MODEL_VERSION = "1"


def _served_model(request: web.Request) -> tuple[ServedModel, str | None]:
    """The served model (and version, when the path names one) the path asks for; a 404 naming what
    is served otherwise."""
    served = served_model(request)
    version = request.match_info.get("version")
    if version is not None and version != MODEL_VERSION:
        raise NotFound(f"no version {version!r} of model {served.name!r} here; it serves version {MODEL_VERSION!r}")
    return served, version


async def server_metadata(request: web.Request) -> web.Response:
    """``GET /v2`` and ``GET /v2/``: who serves, and which protocol extensions."""
    # binary_tensor_data: Triton's binary form of tensors, which tritonclient uses by default.
    return web.json_response({"name": "maskserve", "version": __version__, "extensions": ["binary_tensor_data"]})


async def server_live(request: web.Request) -> web.Response:
    return probe_response(request, live(service_of(request.app)), "not_live", failed_status=NOT_HEALTHY)


async def server_ready(request: web.Request) -> web.Response:
    return probe_response(request, ready(service_of(request.app)), "not_ready", failed_status=NOT_HEALTHY)


async def model_ready(request: web.Request) -> web.Response:
    _served_model(request)
    return await server_ready(request)


async def model_metadata(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}``: the model's tensors: texts in, predictions (JSON) out."""
    served, _ = _served_model(request)
    name = served.name
    model = served.parts.model if served.parts is not None else None
    description = describe_model(model) if model is not None else {}
    backend = str(description.get("backend", "torch"))
    metadata: dict[str, Any] = {
        "name": name,
        "versions": [MODEL_VERSION],
        "platform": PLATFORMS.get(backend, "pytorch"),
        "inputs": [{"name": INPUT_NAME, "datatype": DATATYPE, "shape": [-1]}],
        "outputs": [{"name": OUTPUT_NAME, "datatype": DATATYPE, "shape": [-1]}],
    }
    if model is not None:
        metadata["parameters"] = {"mask_token": model.mask_token, "max_tokens": model.max_tokens}
    return web.json_response(metadata)


# One per served model: the parser compiles its JSON schema once, not per request. Keyed by the
# served model itself, whose hash is its identity (hashing its frozen settings, some forty fields,
# would cost every request); a server's handful of models fills it.
@functools.lru_cache(maxsize=64)
def infer_parser(served: ServedModel) -> InferRequestParser:
    """The protocol's infer request parser, bound to ``served``'s limits."""
    return InferRequestParser(served.settings)


async def infer(request: web.Request) -> web.Response:
    """``POST /v2/models/{model}/infer``: texts in, each text's predictions out, as ``POST /`` would."""
    served, version = _served_model(request)
    # The protocol's envelope (the id to echo, binary or JSON output) around the fill-mask request.
    envelope: InferRequest | None = None

    async def read() -> FillMaskRequest:
        nonlocal envelope
        envelope = infer_parser(served).parse(await read_body(request), request.headers.get(HEADER_LENGTH))
        return envelope.request

    ran = await run_task(request, served, served.fill_mask, read)
    assert envelope is not None  # read() ran, or run_task raised
    payload, headers = infer_response(served.name, envelope, [a.json for a in ran.result], version=version)
    return web.Response(body=payload, headers={**headers, **timing_headers(ran.rows), **windows_header(ran.windows)})
