"""Every route of the server, in one table."""

from __future__ import annotations

from aiohttp import web

from . import views

# Routes that queue work for the model: the circuit breaker may refuse these, and only these.
# Health, metrics, info and the demo page's GET are never shed.
INFERENCE_ROUTES = frozenset({"fill_mask"})


def setup_routes(app: web.Application) -> None:
    app.add_routes(
        [
            web.post("/", views.fill_mask, name="fill_mask"),
        ]
    )
