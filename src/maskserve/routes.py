"""Every route of the server, in one table."""

from __future__ import annotations

from aiohttp import web

from . import health, info, oip, openapi, page, score_page, views
from .keys import service_of
from .service import RouteRoles

ROUTE_ROLES = RouteRoles(
    # Routes that queue work for the model: the circuit-breaking stage may refuse these at the door,
    # and only these. Health, metrics, info and the demo page's GET are never shed; the page's forms
    # (POST /demo, POST /demo/score) ask the same admission themselves, to show a refusal inline.
    inference=frozenset({"fill_mask", "fill_mask_model", "score", "score_model", "oip_infer", "oip_infer_version"}),
    # The page's forms queue work too; the alert rules and the dashboard count them with the above.
    forms=frozenset({"demo", "demo_score"}),
    # Open without an API key: probes (they cannot be expected to hold secrets) and the demo
    # page's GETs, which run nothing. Unknown paths need the key, so the routes cannot be mapped.
    public=frozenset(
        {
            "livez",
            "readyz",
            "index",
            "static",
            "demo_redirect",
            "demo_score_redirect",
            "oip_server_live",
            "oip_server_ready",
            "oip_model_ready",
            "oip_model_ready_version",
        }
    ),
)


def route_table() -> list[web.AbstractRouteDef]:
    """Every route the server has, named: a route's name is its OpenAPI operationId."""
    return [
        web.post("/", views.fill_mask, name="fill_mask"),
        # Pseudo-log-likelihood: each text's masked copies go through the same admission and batcher.
        web.post("/score", views.score, name="score"),
        # The same for any served model by name ({name}: --model's NAME); / and /score serve the
        # first. POST /models/{name} is where the Inference API's clients post (its base URL).
        web.post("/models/{name}", views.fill_mask, name="fill_mask_model"),
        web.post("/models/{name}/score", views.score, name="score_model"),
        # The demo page. The form posts to /demo, never to /: POST / reads any non-JSON body as
        # raw text, so a urlencoded form there would be filled in, not decoded (see page.py).
        # POST /demo asks admission itself, to show a refusal inline.
        web.get("/", page.index, name="index"),
        web.post("/demo", page.demo, name="demo"),
        web.get("/demo", page.demo_redirect, name="demo_redirect"),
        # The page's scoring form: POST /score's path, the answer rendered as the page (score_page.py).
        web.post("/demo/score", score_page.demo_score, name="demo_score"),
        web.get("/demo/score", page.demo_redirect, name="demo_score_redirect"),
        web.static("/static", page.STATIC_DIR, name="static", append_version=True),
        # Operability: answered from the event loop, never shed, never touching the model.
        web.get("/livez", health.livez, name="livez"),
        web.get("/readyz", health.readyz, name="readyz"),
        web.get("/metrics", views.metrics, name="metrics"),
        web.get("/info", info.info, name="info"),
        # The OpenAPI 3.1 document of this table, with the limits this server enforces.
        web.get("/openapi.json", openapi.openapi, name="openapi"),
        # The Open Inference Protocol (KServe v2, Triton, MLServer): the same model, admission,
        # batcher and errors; {model} is any served model's name.
        # Each model route with and without the version segment, as the protocol lists them.
        web.get("/v2", oip.server_metadata, name="oip_server_metadata"),
        web.get("/v2/", oip.server_metadata, name="oip_server_metadata_slash"),
        web.get("/v2/health/live", oip.server_live, name="oip_server_live"),
        web.get("/v2/health/ready", oip.server_ready, name="oip_server_ready"),
        web.get("/v2/models/{model}", oip.model_metadata, name="oip_model_metadata"),
        web.get("/v2/models/{model}/versions/{version}", oip.model_metadata, name="oip_model_metadata_version"),
        web.get("/v2/models/{model}/ready", oip.model_ready, name="oip_model_ready"),
        web.get("/v2/models/{model}/versions/{version}/ready", oip.model_ready, name="oip_model_ready_version"),
        web.post("/v2/models/{model}/infer", oip.infer, name="oip_infer"),
        web.post("/v2/models/{model}/versions/{version}/infer", oip.infer, name="oip_infer_version"),
    ]


def setup_routes(app: web.Application) -> None:
    app.add_routes(route_table())
    service_of(app).routes = ROUTE_ROLES


def served_operations() -> list[openapi.Operation]:
    """The operations :func:`route_table` serves, as the OpenAPI document lists them, without an app."""
    router = web.UrlDispatcher()
    router.add_routes(route_table())
    return openapi.router_operations(router)
