"""Every route of the server, in one table."""

from __future__ import annotations

from aiohttp import web

from . import health, info, views

# Routes that queue work for the model: the circuit breaker may refuse these, and only these.
# Health, metrics, info and the demo page's GET are never shed.
INFERENCE_ROUTES = frozenset({"fill_mask"})


def setup_routes(app: web.Application) -> None:
    app.add_routes(
        [
            web.post("/", views.fill_mask, name="fill_mask"),
            # Operability: answered from the event loop, never shed, never touching the model.
            web.get("/livez", health.livez, name="livez"),
            web.get("/readyz", health.readyz, name="readyz"),
            web.get("/metrics", views.metrics, name="metrics"),
            web.get("/info", info.info, name="info"),
        ]
    )
