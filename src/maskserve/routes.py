"""Every route of the server, in one table."""

from __future__ import annotations

from aiohttp import web

from . import views


def setup_routes(app: web.Application) -> None:
    app.add_routes(
        [
            web.post("/", views.fill_mask, name="fill_mask"),
        ]
    )
