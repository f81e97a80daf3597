"""The Open Inference Protocol ("KServe v2"), as KServe, Triton and MLServer serve it.

    GET  /v2                          server metadata
    GET  /v2/health/live              200 while /livez would be; 400 otherwise (the protocol's 4xx)
    GET  /v2/health/ready             200 while /readyz would be; 400 otherwise
    GET  /v2/models/{model}           model metadata: a BYTES input "text", a BYTES output "predictions"
    GET  /v2/models/{model}/ready     as /v2/health/ready, for the one model served
    POST /v2/models/{model}/infer     fill-mask through the same parser, breaker, batcher and errors

``{model}`` is ``--model-name``; any other name is a 404. Errors keep maskserve's one shape, whose
``error`` string is what the protocol's clients read. The tensors' form is in oip_schemas.py.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from . import __version__
from .deadlines import request_deadline
from .errors import NotFound
from .health import live, probe_response, ready
from .keys import MODEL_KEY, OIP_PARSER_KEY, PARSER_KEY, SETTINGS_KEY
from .model_api import describe_model
from .oip_schemas import DATATYPE, HEADER_LENGTH, INPUT_NAME, OUTPUT_NAME, infer_response
from .views import answer, request_trace, timing_headers

# The protocol says a failed health check is a 4xx; Triton answers 400, and so does maskserve.
NOT_HEALTHY = 400
# The protocol's platform names for what runs the model (its "Platforms" list has no eager PyTorch).
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "openvino": "openvino"}


def _served_model(request: web.Request) -> str:
    """The model the path names, when it is the one served; a 404 naming the right one otherwise."""
    name = request.app[SETTINGS_KEY].model_name
    if request.match_info["model"] != name:
        raise NotFound(f"no model named {request.match_info['model']!r} here; this server serves {name!r}")
    return name


async def server_metadata(request: web.Request) -> web.Response:
    """``GET /v2``: who serves, and which protocol extensions."""
    # binary_tensor_data: Triton's binary form of tensors, which tritonclient uses by default.
    return web.json_response({"name": "maskserve", "version": __version__, "extensions": ["binary_tensor_data"]})


async def server_live(request: web.Request) -> web.Response:
    return probe_response(request, live(request.app), "not_live", failed_status=NOT_HEALTHY)


async def server_ready(request: web.Request) -> web.Response:
    return probe_response(request, ready(request.app), "not_ready", failed_status=NOT_HEALTHY)


async def model_ready(request: web.Request) -> web.Response:
    _served_model(request)
    return await server_ready(request)


async def model_metadata(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}``: the model's tensors: texts in, predictions (JSON) out."""
    name = _served_model(request)
    model = request.app.get(MODEL_KEY)
    description = describe_model(model) if model is not None else {}
    backend = str(description.get("backend", "torch"))
    metadata: dict[str, Any] = {
        "name": name,
        "versions": ["1"],
        "platform": PLATFORMS.get(backend, "pytorch"),
        "inputs": [{"name": INPUT_NAME, "datatype": DATATYPE, "shape": [-1]}],
        "outputs": [{"name": OUTPUT_NAME, "datatype": DATATYPE, "shape": [-1]}],
    }
    if model is not None:
        metadata["parameters"] = {"mask_token": model.mask_token, "max_tokens": model.max_tokens}
    return web.json_response(metadata)


async def infer(request: web.Request) -> web.Response:
    """``POST /v2/models/{model}/infer``: texts in, each text's predictions out, as ``POST /`` would."""
    name = _served_model(request)
    deadline = request_deadline(request)
    with request_trace(request).step("maskserve.parse"):
        body = await request.read()
        parsed = request.app[OIP_PARSER_KEY].parse(body, request.headers.get(HEADER_LENGTH))
        queries = request.app[PARSER_KEY].queries(parsed.request, request.app[MODEL_KEY])
    answers = await answer(request, queries, deadline)
    payload, headers = infer_response(name, parsed, [a.predictions for a in answers])
    return web.Response(body=payload, headers={**headers, **timing_headers(answers)})
