"""service/registry.py: the served models by name and the 404 for an unknown one, the parts known
only once loaded, and the route roles."""

from __future__ import annotations

import pytest

from maskserve.config.settings import Settings
from maskserve.errors import NotFound
from maskserve.service.registry import FillMaskService, RouteRoles

TWO_MODELS = Settings(model=("first=/models/first", "second=/models/second"), warmup=False)


def test_the_models_are_served_by_name_in_order_the_first_the_default() -> None:
    service = FillMaskService(TWO_MODELS)
    assert list(service.models) == ["first", "second"]
    assert service.default is service.models["first"]
    assert service.served() is service.default
    assert service.served("second") is service.models["second"]


def test_a_server_of_one_model_serves_it_under_the_model_name() -> None:
    service = FillMaskService(Settings(model_name="mine"))
    assert list(service.models) == ["mine"] and service.default.name == "mine"


def test_an_unknown_model_is_a_404_naming_every_served_model() -> None:
    with pytest.raises(NotFound, match=r"^no model named 'third' here; this server serves 'first', 'second'$"):
        FillMaskService(TWO_MODELS).served("third")


def test_before_loading_the_parts_are_a_bug_to_ask_for() -> None:
    service = FillMaskService(TWO_MODELS)
    with pytest.raises(RuntimeError, match="the models are not loaded yet; this is a bug"):
        service.scheduler  # noqa: B018 - the property raises
    with pytest.raises(RuntimeError, match=r"model 'second' is not loaded yet; this is a bug"):
        service.models["second"].loaded  # noqa: B018 - the property raises


def test_the_service_keeps_its_middleware_and_starts_serving() -> None:
    service = FillMaskService(Settings(), ("errors", "admission"))
    assert service.middleware == ("errors", "admission")
    assert not service.lifecycle.draining and service.loaded is None


def test_model_work_is_the_inference_routes_and_the_forms() -> None:
    roles = RouteRoles(inference=frozenset({"fill_mask"}), public=frozenset({"livez"}), forms=frozenset({"demo"}))
    assert roles.model_work == {"fill_mask", "demo"}
