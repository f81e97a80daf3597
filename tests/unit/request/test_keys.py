"""request/keys.py: the service is reached on the app the factory built, and each request's record
is made on first use and kept."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from maskserve.config.settings import Settings
from maskserve.http.app import create_app
from maskserve.request.keys import REQUEST_KEY, SERVICE_KEY, service_of, state_of
from maskserve.request.state import RequestState
from maskserve.service.registry import FillMaskService
from tests.fakes import EchoModel


def test_the_service_of_an_app_is_the_one_the_factory_built_from_its_settings() -> None:
    settings = Settings(max_queue=9, warmup=False)
    app = create_app(settings, engine=EchoModel())
    service = service_of(app)
    assert isinstance(service, FillMaskService)
    assert service is app[SERVICE_KEY] and service.settings is settings


def test_a_requests_record_is_made_on_first_use() -> None:
    request = make_mocked_request("GET", "/")
    assert request.get(REQUEST_KEY) is None
    state = state_of(request)
    assert isinstance(state, RequestState) and state.id == "-"
    assert request[REQUEST_KEY] is state


def test_a_requests_record_is_the_same_on_every_use() -> None:
    request = make_mocked_request("GET", "/")
    state_of(request).id = "req-7"
    assert state_of(request) is state_of(request)
    assert state_of(request).id == "req-7"


def test_each_request_has_its_own_record() -> None:
    first, second = make_mocked_request("GET", "/"), make_mocked_request("GET", "/")
    state_of(first).kind = "not_found"
    assert state_of(second) is not state_of(first)
    assert state_of(second).kind is None
