"""``GET /openapi.json``: the OpenAPI 3.1 document of every route, built from this server's limits.

Written in code rather than kept as a file, so the numbers in it (``maxItems``, ``maximum``, the
body size) are the ones this server enforces, and the request body schema is the very one the
parser validates with (:func:`maskserve.tasks.fill_mask_request.request_schema`). Each operation is
written once, the model's in operations.py and the rest here; the route table (``http/routes.py``)
names the one each route serves, and hands the table down on
the service, so the document's paths, methods and operation ids are the router's own by
construction. ``tests/unit/api/test_openapi.py`` checks that, and that real responses validate against it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from maskserve import __version__
from maskserve.api.openapi_components import (
    JSON,
    REQUEST_ID,
    Schema,
    component_schemas,
    error,
    header,
    ok,
    ref,
)
from maskserve.api.operations import (
    HTML,
    MODEL_PARAMETER,
    PROMETHEUS,
    demo_redirect_operation,
    fixed,
    oip_probe_operation,
    probe_operation,
)
from maskserve.config.settings import Settings
from maskserve.middleware.error_sanitizer import REQUEST_ID_HEADER
from maskserve.request.keys import service_of
from maskserve.service.registry import Describe, RouteRoles

OPENAPI_VERSION = "3.1.0"
INDEX_DOC = fixed(
    {
        "summary": "The demo page; ?text= and ?top_k= fill in the form without running the model",
        "tags": ["demo"],
        "parameters": [
            {"name": "text", "in": "query", "required": False, "schema": {"type": "string"}},
            {"name": "top_k", "in": "query", "required": False, "schema": {"type": "string"}},
        ],
        "responses": {"200": ok("The page.", HTML, {"type": "string"})},
    }
)
DEMO_REDIRECT_DOC = fixed(demo_redirect_operation())
STATIC_DOC = fixed(
    {
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
            "404": error("No such path."),
        },
    }
)
LIVEZ_DOC = fixed(
    probe_operation(
        "Liveness: 503 only when a forward pass is stuck or the batch loop died",
        "Restart the process when this fails; a busy server is alive.",
    )
)
READYZ_DOC = fixed(
    probe_operation(
        "Readiness: 503 while loading, draining, or stuck; never because of load",
        "Send no traffic here while this fails. Load is answered at the door, request by request.",
    )
)
METRICS_DOC = fixed(
    {
        "summary": "Prometheus metrics",
        "tags": ["operations"],
        "responses": {"200": ok("The exposition.", PROMETHEUS, {"type": "string"})},
    }
)
INFO_DOC = fixed(
    {
        "summary": "The served model, the runtime, batching, breaker and limits, versions",
        "tags": ["operations"],
        "responses": {"200": ok("What is served and how.", JSON, ref("Info"))},
    }
)
OPENAPI_DOC = fixed(
    {
        "summary": "The OpenAPI 3.1 document of every route, with this server's own limits",
        "tags": ["operations"],
        "responses": {"200": ok("The OpenAPI document.", JSON, {"type": "object"})},
    }
)
OIP_SERVER_METADATA_DOC = fixed(
    {
        "summary": "Open Inference Protocol: server metadata",
        "tags": ["open inference protocol"],
        "responses": {"200": ok("Who serves.", JSON, ref("ServerMetadata"))},
    }
)
OIP_SERVER_LIVE_DOC = fixed(oip_probe_operation("Open Inference Protocol: server live (as /livez)"))
OIP_SERVER_READY_DOC = fixed(oip_probe_operation("Open Inference Protocol: server ready (as /readyz)"))
OIP_MODEL_METADATA_DOC = fixed(
    {
        "summary": "Open Inference Protocol: model metadata",
        "tags": ["open inference protocol"],
        "parameters": [MODEL_PARAMETER],
        "responses": {
            "200": ok("The model's tensors.", JSON, ref("ModelMetadata")),
            "404": error("No model of that name is served."),
        },
    }
)
OIP_MODEL_READY_DOC = fixed(oip_probe_operation("Open Inference Protocol: model ready", per_model=True))

REPOSITORY_INDEX_DOC = fixed(
    {
        "summary": "Model repository: every model, its version, state and reason",
        "description": "Triton's repository extension. 404 with --model-control-mode none (the extension is off).",
        "tags": ["model repository"],
        "requestBody": {
            "required": False,
            "content": {JSON: {"schema": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}},
        },
        "responses": {
            "200": ok("The models.", JSON, {"type": "array", "items": ref("RepositoryModel")}),
            "400": error("The body is not JSON."),
            "404": error("The extension is off (--model-control-mode none)."),
            "422": error("A member of the body has the wrong type."),
        },
    }
)


def _change_doc(summary: str, description: str, responses: dict[str, Schema]) -> Describe:
    return fixed(
        {
            "summary": summary,
            "description": description
            + " Needs the control key (--control-key) as `Authorization: Bearer`; the API key does not grant it.",
            "tags": ["model repository"],
            "parameters": [MODEL_PARAMETER],
            "security": [{"control": []}],
            "requestBody": {
                "required": False,
                "content": {JSON: {"schema": {"type": "object", "properties": {"parameters": {"type": "object"}}}}},
            },
            "responses": {
                "200": {"description": "Done.", "headers": {REQUEST_ID_HEADER: REQUEST_ID}},
                "401": error("No control key.", ("WWW-Authenticate", header("The Bearer challenge.", required=True))),
                "403": error("Not the control key, or control is off (no --control-key)."),
                "404": error("No such model in the repository, or the extension is off (--model-control-mode none)."),
                "422": error("A member of the body is not usable."),
                **responses,
            },
        }
    )


REPOSITORY_LOAD_DOC = _change_doc(
    "Model repository: load or reload a model",
    "Answers once the model serves. `parameters.config`: a JSON object (as a string) of the model's own settings.",
    {
        "400": error(
            "The body is not JSON, or `parameters.config` is not usable (model_config_invalid); "
            "a model that served still does."
        ),
        "409": error(
            "The model's folder cannot load as it stands (model_not_loadable): its settings file, its files; "
            "a model that served still does."
        ),
        "500": error(
            "The load failed on the server's side (model_load_failed: the engine, a worker, a timeout); "
            "the reason says why, the server log has more, and a model that served still does."
        ),
        "507": error("The load would pass --models-memory even with every idle model unloaded."),
    },
)
REPOSITORY_UNLOAD_DOC = _change_doc(
    "Model repository: unload a model",
    "Answers once what it accepted is answered and its memory is released.",
    {"400": error("The body is not JSON.")},
)


def openapi_document(settings: Settings, roles: RouteRoles, mask_token: str = "[MASK]") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the route table's operations (``roles.operations``, handed down
    by http/routes.py), with ``settings``' limits and the model's ``mask_token`` in the examples."""
    paths: dict[str, dict[str, Schema]] = {}
    for route in roles.operations:
        # Each its own copy: operations that share a description still get their own id.
        operation = {**route.describe(settings, mask_token), "operationId": route.name}
        if settings.api_key and route.name not in roles.public | roles.control:
            operation["security"] = [{"bearer": []}]
            operation["responses"] = operation["responses"] | {
                "401": error(
                    "No valid key: send `Authorization: Bearer <key>`.",
                    ("WWW-Authenticate", header("The Bearer challenge (RFC 6750).", required=True)),
                )
            }
        paths.setdefault(route.path, {})[route.method] = operation
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
        "paths": paths,
        "components": {"schemas": component_schemas(settings)},
    }
    schemes = document["components"]["securitySchemes"] = {
        "control": {"type": "http", "scheme": "bearer", "description": "One of the keys of --control-key."}
    }
    if settings.api_key:
        schemes["bearer"] = {"type": "http", "scheme": "bearer", "description": "One of the keys of --api-key."}
    return document


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document, with this server's limits and its model's mask token."""
    service = service_of(request.app)
    default = service.models.get(service.default_name) or next(iter(service.models.values()), None)
    mask_token = default.parts.model.mask_token if default is not None and default.parts is not None else "[MASK]"
    return web.json_response(openapi_document(service.settings, service.routes, mask_token))
