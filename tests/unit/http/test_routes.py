"""The route table's roles: each names routes the table has, and the deploy files count the routes
that queue work for the model, all of them and nothing else."""

from __future__ import annotations

from maskserve.http.routes import ROUTE_ROLES, route_table
from tests.system.deploy.queries import selected_routes


def route_names() -> set[str]:
    return {route.kwargs["name"] for route in route_table()}  # type: ignore[attr-defined]


def test_every_role_names_a_route_of_the_table() -> None:
    names = route_names()
    for role in (ROUTE_ROLES.inference, ROUTE_ROLES.forms, ROUTE_ROLES.public):
        assert role and role <= names, role - names


def test_the_page_forms_are_neither_shed_at_the_door_nor_public() -> None:
    # They ask admission themselves, to show a refusal inline; they run the model, so need the key.
    assert not ROUTE_ROLES.forms & ROUTE_ROLES.inference
    assert not ROUTE_ROLES.forms & ROUTE_ROLES.public
    assert {"demo", "demo_score"} <= ROUTE_ROLES.forms


def test_the_alerts_and_the_dashboard_count_every_route_that_queues_model_work() -> None:
    # One set of routes everywhere (deploy/prometheus, deploy/grafana), and it is the table's.
    assert selected_routes() == {ROUTE_ROLES.model_work}
    assert {"fill_mask", "score", "oip_infer", "oip_infer_version", "demo", "demo_score"} <= ROUTE_ROLES.model_work
