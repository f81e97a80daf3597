"""``GET /openapi.json``: the OpenAPI 3.1 document of every route, built from this server's limits.

Written in code rather than kept as a file, so the numbers in it (``maxItems``, ``maximum``, the
body size) are the ones this server enforces, and the request body schema is the very one the
parser validates with (:func:`maskserve.schemas.request_schema`). ``tests/test_openapi.py`` keeps
it true: every route in the router is documented, and real responses validate against it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from . import __version__
from .deadlines import TIMEOUT_HEADER
from .errors import MaskserveError
from .keys import service_of
from .middleware.errors import REQUEST_ID_HEADER
from .oip_schemas import DATATYPE, HEADER_LENGTH, INPUT_NAME, OUTPUT_NAME, infer_request_schema
from .schemas import request_schema
from .service import RouteRoles
from .settings import Settings

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"
HTML = "text/html"
# The Prometheus text exposition format, as prometheus_client names it.
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

Schema = dict[str, Any]

# Each documented operation's route name in routes.py: its operationId, and how the route table's
# roles (which need no key) name it.
ROUTE_NAMES = {
    ("post", "/"): "fill_mask",
    ("get", "/"): "index",
    ("post", "/demo"): "demo",
    ("get", "/demo"): "demo_redirect",
    ("get", "/static/{filename}"): "static",
    ("get", "/livez"): "livez",
    ("get", "/readyz"): "readyz",
    ("get", "/metrics"): "metrics",
    ("get", "/info"): "info",
    ("get", "/openapi.json"): "openapi",
    ("get", "/v2"): "oip_server_metadata",
    ("get", "/v2/"): "oip_server_metadata_slash",
    ("get", "/v2/health/live"): "oip_server_live",
    ("get", "/v2/health/ready"): "oip_server_ready",
    ("get", "/v2/models/{model}"): "oip_model_metadata",
    ("get", "/v2/models/{model}/versions/{version}"): "oip_model_metadata_version",
    ("get", "/v2/models/{model}/ready"): "oip_model_ready",
    ("get", "/v2/models/{model}/versions/{version}/ready"): "oip_model_ready_version",
    ("post", "/v2/models/{model}/infer"): "oip_infer",
    ("post", "/v2/models/{model}/versions/{version}/infer"): "oip_infer_version",
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def error_kinds() -> list[str]:
    """Every ``kind`` an error body may carry: walked from the error tree, so none is forgotten."""
    kinds: set[str] = set()
    pending: list[type[MaskserveError]] = [MaskserveError]
    while pending:
        cls = pending.pop()
        kinds.add(cls.kind)
        pending.extend(cls.__subclasses__())
    return sorted(kinds)


def _schemas(limits: Settings) -> dict[str, Schema]:
    prediction = {
        "type": "object",
        "required": ["score", "token", "token_str", "sequence"],
        "additionalProperties": False,
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "token": {"type": "integer", "minimum": 0},
            "token_str": {"type": "string"},
            "sequence": {"type": "string"},
        },
    }
    predictions = {"type": "array", "items": _ref("Prediction"), "maxItems": limits.max_top_k}
    per_mask = {"type": "array", "items": _ref("Predictions")}
    text_answer = {"anyOf": [_ref("Predictions"), per_mask]}
    return {
        "FillMaskRequest": request_schema(limits),
        "Prediction": prediction,
        "Predictions": predictions,
        "FillMaskResponse": {
            "description": (
                "The fill-mask pipeline's shape: a text with one mask answers a list of predictions, "
                "with several masks a list of such lists; a list of inputs answers one of those per input."
            ),
            "anyOf": [
                text_answer,
                {"type": "array", "items": text_answer, "minItems": 1, "maxItems": limits.max_inputs},
            ],
        },
        "Error": {
            "description": (
                "The Hugging Face Inference API's error shape (TGI and TEI use it too), which the "
                "official clients read: `error` is the message for people, `error_type` the stable "
                "kind for programs; the other keys are maskserve's details."
            ),
            "type": "object",
            "required": ["error", "error_type", "request_id"],
            "additionalProperties": False,
            "properties": {
                "error": {"type": "string", "minLength": 1},
                "error_type": {"type": "string", "enum": error_kinds()},
                "request_id": {"type": "string", "minLength": 1},
                "retry_after": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "On 429 and 503: the Retry-After header's seconds.",
                },
                "field": {
                    "type": "string",
                    "description": "On a 4xx about one part of the request: its JSON path, form field or header.",
                },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status", "problems"],
            # The facts a probe looked at (queue depth, busy time...) follow these two fields.
            "additionalProperties": True,
            "properties": {
                "status": {"enum": ["ok", "unavailable"]},
                "problems": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["code", "message"],
                        "additionalProperties": False,
                        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
            },
        },
        "InferRequest": infer_request_schema(limits),
        "InferResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string", "description": "The version, when the path named one."},
                "id": {"type": "string", "description": "The request's id, echoed."},
                "outputs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "datatype", "shape"],
                        "properties": {
                            "name": {"const": OUTPUT_NAME},
                            "datatype": {"const": DATATYPE},
                            "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                            "data": {
                                "type": "array",
                                "description": "Per text, the JSON that POST / answers for that text, as a string.",
                                "items": {"type": "string"},
                            },
                            "parameters": {"type": "object"},
                        },
                    },
                },
            },
        },
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("TensorMetadata")},
                "outputs": {"type": "array", "items": _ref("TensorMetadata")},
                "parameters": {"type": "object"},
            },
        },
        "TensorMetadata": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "Info": {
            "type": "object",
            "required": ["model", "batching", "breaker", "limits", "versions"],
            "properties": {
                name: {"type": ["object", "null"]} for name in ("model", "batching", "breaker", "limits", "versions")
            },
        },
    }


def _header(description: str, schema: Schema | None = None, *, required: bool = False) -> Schema:
    return {"description": description, "required": required, "schema": schema or {"type": "string"}}


REQUEST_ID = _header("The request's id: the caller's when short and plain, else a new one.", required=True)


def _error(description: str, *extra_headers: tuple[str, Schema]) -> Schema:
    return {
        "description": description,
        "headers": {REQUEST_ID_HEADER: REQUEST_ID, **dict(extra_headers)},
        "content": {JSON: {"schema": _ref("Error")}},
    }


def _retry_after() -> tuple[str, Schema]:
    return (
        "Retry-After",
        _header(
            "Whole seconds to wait before retrying, computed from the work ahead.", {"type": "string"}, required=True
        ),
    )


def _ok(description: str, content_type: str, schema: Schema, **headers: Schema) -> Schema:
    return {
        "description": description,
        "headers": {REQUEST_ID_HEADER: REQUEST_ID, **headers},
        "content": {content_type: {"schema": schema}},
    }


def _probe(summary: str, description: str) -> Schema:
    return {
        "summary": summary,
        "description": description,
        "tags": ["operations"],
        "responses": {
            "200": _ok("Healthy.", JSON, _ref("Health")),
            "503": _ok("Not healthy; `problems` says why.", JSON, _ref("Health")),
        },
    }


def _timing_headers() -> dict[str, Schema]:
    return {
        "X-Queue-Time-Ms": _header("Milliseconds the slowest text waited in the queue."),
        "X-Inference-Time-Ms": _header("Milliseconds of the forward pass that answered it."),
        "X-Batch-Size": _header("Texts in that forward pass."),
    }


def _fill_mask(settings: Settings, limits: Settings, mask_token: str) -> Schema:
    example = f"Paris is the {mask_token} of France."
    raw_text = {"schema": {"type": "string", "minLength": 1, "maxLength": settings.max_text_chars}, "example": example}
    return {
        "summary": "Fill in the mask tokens of one text or of a list of texts",
        "description": (
            "Two forms. The Hugging Face Inference API's JSON (`Content-Type: application/json`), or "
            "the raw text itself with any other content type (never form-decoded: `curl -d` works). "
            f"Limits: a body of at most {settings.max_body_bytes} bytes, at most {settings.max_inputs} "
            f"inputs of at most {settings.max_text_chars} characters each (and the model's token limit), "
            f"top_k from 1 to {settings.max_top_k}, at most {settings.max_targets} targets, JSON nested at "
            f"most {limits.max_json_depth} levels."
        ),
        "tags": ["inference"],
        "parameters": [
            {
                "name": TIMEOUT_HEADER,
                "in": "header",
                "required": False,
                "description": (
                    f"Seconds this request may take; shortens (never lengthens) the server's "
                    f"{settings.request_timeout:g} s. Not a positive number: 400."
                ),
                "schema": {"type": "number", "exclusiveMinimum": 0},
            },
            {
                "name": REQUEST_ID_HEADER,
                "in": "header",
                "required": False,
                # Any value is accepted (never a 400): one that is not short and plain is replaced.
                "description": (
                    "An id to find this request in the server's log: kept when it matches "
                    "`^[A-Za-z0-9._:-]{1,64}$`, else replaced by a fresh one."
                ),
                "schema": {"type": "string"},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                JSON: {
                    "schema": _ref("FillMaskRequest"),
                    "example": {"inputs": example, "parameters": {"top_k": 3}},
                },
                "text/plain": raw_text,
                "application/x-www-form-urlencoded": raw_text,
            },
        },
        "responses": {
            "200": _ok("The predictions.", JSON, _ref("FillMaskResponse"), **_timing_headers()),
            "400": _error("The body is not UTF-8 or not JSON, or a header is unusable."),
            "413": _error(f"The body is larger than {settings.max_body_bytes} bytes (--max-body-bytes)."),
            "422": _error("Well-formed but unusable: no mask token, too long, a value out of range, unknown field."),
            "500": _error("The model failed on this input (its batch neighbours were answered)."),
            "503": _error("Overloaded or shutting down: refused before the body is read.", _retry_after()),
            "504": _error("The deadline passed before the answer was ready."),
        },
    }


MODEL_PARAMETER = {
    "name": "model",
    "in": "path",
    "required": True,
    "description": "The model's name, --model-name; any other is a 404.",
    "schema": {"type": "string"},
}
VERSION_PARAMETER: Schema = {
    "name": "version",
    "in": "path",
    "required": True,
    "description": "The model's version: 1, the one served (model metadata lists it); any other is a 404.",
    "schema": {"type": "string"},
}


def _oip_probe(summary: str, *, per_model: bool = False) -> Schema:
    probe: Schema = {
        "summary": summary,
        "description": "The protocol's health check: 200, or 400 (its 4xx) with the problems, as /readyz says them.",
        "tags": ["open inference protocol"],
        "responses": {
            "200": _ok("Healthy.", JSON, _ref("Health")),
            "400": _ok("Not healthy; `problems` says why.", JSON, _ref("Health")),
        },
    }
    if per_model:
        probe["parameters"] = [MODEL_PARAMETER]
        probe["responses"]["404"] = _error("No model of that name is served.")
    return probe


def _oip_infer(settings: Settings, limits: Settings, mask_token: str) -> Schema:
    example = f"Paris is the {mask_token} of France."
    return {
        "summary": "Open Inference Protocol inference: texts in, each text's predictions out",
        "description": (
            f'One BYTES input "{INPUT_NAME}" of shape [n], 1 <= n <= {settings.max_inputs}; one BYTES output '
            f'"{OUTPUT_NAME}" of the same shape, each element the JSON `POST /` answers for that text. '
            "`top_k` and `targets` (comma-separated, or a list) are request parameters. Tensors in JSON, or "
            f"in Triton's binary tensor data extension ({HEADER_LENGTH}; the answer follows the request's "
            "binary_data / binary_data_output). Same limits, admission, deadline and errors as `POST /`."
        ),
        "tags": ["open inference protocol"],
        "parameters": [MODEL_PARAMETER],
        "requestBody": {
            "required": True,
            "content": {
                JSON: {
                    "schema": _ref("InferRequest"),
                    "example": {
                        "inputs": [{"name": INPUT_NAME, "shape": [1], "datatype": DATATYPE, "data": [example]}],
                        "parameters": {"top_k": 3},
                    },
                }
            },
        },
        "responses": {
            "200": _ok("Each text's predictions.", JSON, _ref("InferResponse"), **_timing_headers())
            | {
                "content": {
                    JSON: {"schema": _ref("InferResponse")},
                    # Triton's binary form: the JSON header, then the tensor (see the description).
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                }
            },
            "400": _error("The body is not JSON, or the binary tensor framing is wrong."),
            "404": _error("No model of that name is served."),
            "413": _error(f"The body is larger than {settings.max_body_bytes} bytes (--max-body-bytes)."),
            "422": _error("Well-formed but unusable: the tensor's name, type or shape, no mask token, a value."),
            "500": _error("The model failed on this input (its batch neighbours were answered)."),
            "503": _error("Overloaded or shutting down: refused before the body is read.", _retry_after()),
            "504": _error("The deadline passed before the answer was ready."),
        },
    }


def _versioned(operation: Schema) -> Schema:
    """The same operation on the path that also names the model's version."""
    versioned = {**operation, "parameters": [*operation.get("parameters", []), VERSION_PARAMETER]}
    versioned["responses"] = {
        **operation["responses"],
        "404": _error("No model of that name, or no such version of it, is served."),
    }
    return versioned


def _oip_paths(settings: Settings, limits: Settings, mask_token: str) -> dict[str, Schema]:
    not_found = {"404": _error("No model of that name is served.")}
    server_metadata = {
        "summary": "Open Inference Protocol: server metadata",
        "tags": ["open inference protocol"],
        "responses": {"200": _ok("Who serves.", JSON, _ref("ServerMetadata"))},
    }
    model_metadata = {
        "summary": "Open Inference Protocol: model metadata",
        "tags": ["open inference protocol"],
        "parameters": [MODEL_PARAMETER],
        "responses": {"200": _ok("The model's tensors.", JSON, _ref("ModelMetadata"))} | not_found,
    }
    model_ready = _oip_probe("Open Inference Protocol: model ready", per_model=True)
    infer = _oip_infer(settings, limits, mask_token)
    return {
        "/v2": {"get": server_metadata},
        "/v2/": {"get": dict(server_metadata)},  # its own copy: each operation gets its own id
        "/v2/health/live": {"get": _oip_probe("Open Inference Protocol: server live (as /livez)")},
        "/v2/health/ready": {"get": _oip_probe("Open Inference Protocol: server ready (as /readyz)")},
        "/v2/models/{model}": {"get": model_metadata},
        "/v2/models/{model}/versions/{version}": {"get": _versioned(model_metadata)},
        "/v2/models/{model}/ready": {"get": model_ready},
        "/v2/models/{model}/versions/{version}/ready": {"get": _versioned(model_ready)},
        "/v2/models/{model}/infer": {"post": infer},
        "/v2/models/{model}/versions/{version}/infer": {"post": _versioned(infer)},
    }


def _demo(settings: Settings) -> Schema:
    form = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": settings.max_text_chars},
            "top_k": {"type": "string", "description": f"A whole number from 1 to {settings.max_top_k}."},
        },
    }
    page = {"type": "string"}
    return {
        "summary": "The demo page's form: the answer (or the error in plain words) as the page",
        "tags": ["demo"],
        "requestBody": {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": form}}},
        "responses": {
            status: _ok(description, HTML, page)
            for status, description in (
                ("200", "The page with the predictions."),
                ("422", "The page with the problem shown next to the field."),
                ("500", "The page saying the model failed on this text."),
                ("503", "The page saying the server is busy or restarting."),
                ("504", "The page saying the answer was not ready in time."),
            )
        }
        # Raised while reading the form, before the page can render: the API's error shape.
        | {
            "400": _error("The form cannot be read (not UTF-8, a broken multipart body)."),
            "413": _error(f"The form is larger than {settings.max_body_bytes} bytes (--max-body-bytes)."),
        },
    }


def openapi_document(settings: Settings, roles: RouteRoles, mask_token: str = "[MASK]") -> dict[str, Any]:
    """The OpenAPI 3.1 document of this server, with ``settings``' limits."""
    limits = settings  # the request limits are the settings' own
    not_found = {"404": _error("No such path.")}
    document: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "maskserve",
            "version": __version__,
            "description": (
                "Fill-mask inference over HTTP with dynamic batching and circuit breaking, in the Hugging "
                "Face Inference API's form (`POST /`) and the Open Inference Protocol's (`/v2`). Every "
                'error is `{"error": message, "error_type": kind, "request_id", ...details}`; a path '
                "that matches no route is 404 and a method a path does not take is 405 with `Allow`, both "
                "in that shape."
            ),
        },
        "paths": {
            "/": {
                "post": _fill_mask(settings, limits, mask_token),
                "get": {
                    "summary": "The demo page; ?text= and ?top_k= fill in the form without running the model",
                    "tags": ["demo"],
                    "parameters": [
                        {"name": "text", "in": "query", "required": False, "schema": {"type": "string"}},
                        {"name": "top_k", "in": "query", "required": False, "schema": {"type": "string"}},
                    ],
                    "responses": {"200": _ok("The page.", HTML, {"type": "string"})},
                },
            },
            "/demo": {
                "post": _demo(settings),
                "get": {
                    "summary": "A reload of the answered page: back to the page itself",
                    "tags": ["demo"],
                    "responses": {
                        "303": {
                            "description": "Redirect to `/`, the query kept.",
                            "headers": {"Location": _header("The page's URL.", required=True)},
                        }
                    },
                },
            },
            "/static/{filename}": {
                "get": {
                    "summary": "The demo page's own CSS and JavaScript",
                    "tags": ["demo"],
                    "parameters": [{"name": "filename", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {
                            "description": "The file.",
                            # The JavaScript's type depends on the platform's mimetypes table.
                            "content": {
                                kind: {"schema": {"type": "string"}}
                                for kind in ("text/css", "text/javascript", "application/javascript")
                            },
                        },
                    }
                    | not_found,
                }
            },
            "/livez": {
                "get": _probe(
                    "Liveness: 503 only when a forward pass is stuck or the batch loop died",
                    "Restart the process when this fails; a busy server is alive.",
                )
            },
            "/readyz": {
                "get": _probe(
                    "Readiness: 503 while loading, draining, or when a new request would be refused",
                    "Send no traffic here while this fails.",
                )
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "tags": ["operations"],
                    "responses": {"200": _ok("The exposition.", PROMETHEUS, {"type": "string"})},
                }
            },
            "/info": {
                "get": {
                    "summary": "The served model, the runtime, batching, breaker and limits, versions",
                    "tags": ["operations"],
                    "responses": {"200": _ok("What is served and how.", JSON, _ref("Info"))},
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "tags": ["operations"],
                    "responses": {"200": _ok("The OpenAPI document.", JSON, {"type": "object"})},
                }
            },
        }
        | _oip_paths(settings, limits, mask_token),
        "components": {"schemas": _schemas(limits)},
    }
    for path, item in document["paths"].items():
        for method, operation in item.items():
            operation["operationId"] = ROUTE_NAMES[method, path]
            if settings.api_key and operation["operationId"] not in roles.public:
                operation["security"] = [{"bearer": []}]
                operation["responses"]["401"] = _error(
                    "No valid key: send `Authorization: Bearer <key>`.",
                    ("WWW-Authenticate", _header("The Bearer challenge (RFC 6750).", required=True)),
                )
    if settings.api_key:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "One of the keys of --api-key."}
        }
    return document


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document, with this server's limits and its model's mask token."""
    service = service_of(request.app)
    mask_token = service.loaded.model.mask_token if service.loaded is not None else "[MASK]"
    return web.json_response(openapi_document(service.settings, service.routes, mask_token))
