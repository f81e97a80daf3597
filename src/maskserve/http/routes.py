"""Every route of the server, in one table: its method, path, name, handler, role and OpenAPI operation.

The router's routes, the roles the stages read (``ROUTE_ROLES``) and the OpenAPI document's paths
are all derived from :data:`ROUTES`; a path is written nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler

from maskserve.api import health, info, oip, openapi, operations, repository, views
from maskserve.api.operations import for_model, versioned
from maskserve.demo import page, score_form
from maskserve.request.keys import service_of
from maskserve.rpc import INFERENCE_METHODS
from maskserve.service.registry import Describe, RouteOperation, RouteRoles

# What the stages treat apart:
# - inference: queues work for the model, so the circuit-breaking stage may refuse it at the door
#   (and only these). Health, metrics, info and the demo page's GETs are never shed.
# - form: the page's forms queue work too, but ask the same admission themselves to show a refusal
#   inline; the alert rules and the dashboard count them with the above.
# - public: open without an API key: probes (they cannot be expected to hold secrets) and the demo
#   page's GETs, which run nothing. Unknown paths need the key, so the routes cannot be mapped.
# - control: loads and unloads models; needs the control key instead of the API key (checked by
#   its handler, so no middleware specification can leave it open).
Role = Literal["inference", "form", "public", "control"]


@dataclass(frozen=True)
class Route:
    """One route. ``handler`` is a folder for a static route (``method`` "GET"), whose files it serves."""

    method: Literal["GET", "POST"]
    path: str
    name: str  # also its OpenAPI operationId
    handler: Handler | Path
    describe: Describe  # its OpenAPI operation
    role: Role | None = None

    def definition(self) -> web.AbstractRouteDef:
        if isinstance(self.handler, Path):
            return web.static(self.path, self.handler, name=self.name, append_version=True)
        if self.method == "GET":  # with HEAD beside it, as aiohttp adds
            return web.get(self.path, self.handler, name=self.name)
        return web.post(self.path, self.handler, name=self.name)

    def operation(self) -> RouteOperation:
        path = self.path + "/{filename}" if isinstance(self.handler, Path) else self.path
        return RouteOperation(self.method.lower(), path, self.name, self.describe)


ROUTES: tuple[Route, ...] = (
    Route("POST", "/", "fill_mask", views.fill_mask, operations.fill_mask_doc, "inference"),
    # Pseudo-log-likelihood: each text's masked copies go through the same admission and batcher.
    Route("POST", "/score", "score", views.score, operations.score_doc, "inference"),
    # The same for any served model by name ({name}: --model's NAME); / and /score serve the
    # first. POST /models/{name} is where the Inference API's clients post (its base URL).
    Route(
        "POST",
        "/models/{name}",
        "fill_mask_model",
        views.fill_mask,
        for_model(operations.fill_mask_doc, "`POST /`"),
        "inference",
    ),
    Route(
        "POST",
        "/models/{name}/score",
        "score_model",
        views.score,
        for_model(operations.score_doc, "`POST /score`"),
        "inference",
    ),
    # The demo page. The form posts to /demo, never to /: POST / reads any non-JSON body as raw
    # text, so a urlencoded form there would be filled in, not decoded (see demo/page.py).
    Route("GET", "/", "index", page.index, openapi.INDEX_DOC, "public"),
    Route("POST", "/demo", "demo", page.demo, operations.demo_doc, "form"),
    Route("GET", "/demo", "demo_redirect", page.demo_redirect, openapi.DEMO_REDIRECT_DOC, "public"),
    # The page's scoring form: POST /score's path, the answer rendered as the page (score_form.py).
    Route("POST", "/demo/score", "demo_score", score_form.demo_score, operations.demo_score_doc, "form"),
    Route("GET", "/demo/score", "demo_score_redirect", page.demo_redirect, openapi.DEMO_REDIRECT_DOC, "public"),
    Route("GET", "/static", "static", page.STATIC_DIR, openapi.STATIC_DOC, "public"),
    # Operability: answered from the event loop, never shed, never touching the model.
    Route("GET", "/livez", "livez", health.livez, openapi.LIVEZ_DOC, "public"),
    Route("GET", "/readyz", "readyz", health.readyz, openapi.READYZ_DOC, "public"),
    Route("GET", "/metrics", "metrics", views.metrics, openapi.METRICS_DOC),
    Route("GET", "/info", "info", info.info, openapi.INFO_DOC),
    # The OpenAPI 3.1 document of this table, with the limits this server enforces.
    Route("GET", "/openapi.json", "openapi", openapi.openapi, openapi.OPENAPI_DOC),
    # The Open Inference Protocol (KServe v2, Triton, MLServer): the same model, admission,
    # batcher and errors; {model} is any served model's name. Each model route with and without
    # the version segment, as the protocol lists them.
    Route("GET", "/v2", "oip_server_metadata", oip.server_metadata, openapi.OIP_SERVER_METADATA_DOC),
    Route("GET", "/v2/", "oip_server_metadata_slash", oip.server_metadata, openapi.OIP_SERVER_METADATA_DOC),
    Route("GET", "/v2/health/live", "oip_server_live", oip.server_live, openapi.OIP_SERVER_LIVE_DOC, "public"),
    Route("GET", "/v2/health/ready", "oip_server_ready", oip.server_ready, openapi.OIP_SERVER_READY_DOC, "public"),
    Route("GET", "/v2/models/{model}", "oip_model_metadata", oip.model_metadata, openapi.OIP_MODEL_METADATA_DOC),
    Route(
        "GET",
        "/v2/models/{model}/versions/{version}",
        "oip_model_metadata_version",
        oip.model_metadata,
        versioned(openapi.OIP_MODEL_METADATA_DOC),
    ),
    Route("GET", "/v2/models/{model}/ready", "oip_model_ready", oip.model_ready, openapi.OIP_MODEL_READY_DOC, "public"),
    Route(
        "GET",
        "/v2/models/{model}/versions/{version}/ready",
        "oip_model_ready_version",
        oip.model_ready,
        versioned(openapi.OIP_MODEL_READY_DOC),
        "public",
    ),
    Route("POST", "/v2/models/{model}/infer", "oip_infer", oip.infer, operations.oip_infer_doc, "inference"),
    Route(
        "POST",
        "/v2/models/{model}/versions/{version}/infer",
        "oip_infer_version",
        oip.infer,
        versioned(operations.oip_infer_doc),
        "inference",
    ),
)


# The model repository extension (Triton's, over REST): 404 unless --model-control-mode allows it.
REPOSITORY_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v2/repository/index", "repository_index", repository.index, openapi.REPOSITORY_INDEX_DOC),
    Route(
        "POST",
        "/v2/repository/models/{model}/load",
        "repository_load",
        repository.load,
        openapi.REPOSITORY_LOAD_DOC,
        "control",
    ),
    Route(
        "POST",
        "/v2/repository/models/{model}/unload",
        "repository_unload",
        repository.unload,
        openapi.REPOSITORY_UNLOAD_DOC,
        "control",
    ),
)
ROUTES += REPOSITORY_ROUTES


def route_roles(routes: Sequence[Route]) -> RouteRoles:
    """What ``routes`` say of themselves, for the stages that treat some apart and for OpenAPI."""

    def named(role: Role) -> frozenset[str]:
        return frozenset(route.name for route in routes if route.role == role)

    return RouteRoles(
        inference=named("inference"),
        forms=named("form"),
        public=named("public"),
        control=named("control"),
        operations=tuple(route.operation() for route in routes),
        calls=INFERENCE_METHODS,
    )


ROUTE_ROLES = route_roles(ROUTES)


def route_table(routes: Sequence[Route] = ROUTES) -> list[web.AbstractRouteDef]:
    """Every route the server has, named: a route's name is its OpenAPI operationId."""
    return [route.definition() for route in routes]


def setup_routes(app: web.Application, routes: Sequence[Route] = ROUTES) -> None:
    """``routes`` on the app (the server's own table unless a caller adds to it), and what they say
    of themselves on the service."""
    app.add_routes(route_table(routes))
    service_of(app).routes = route_roles(routes)
