"""request/deadlines.py: X-Request-Timeout can only shorten the server's timeout, a bad one is a 400,
and a request's deadline is fixed once, on the event loop's clock."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import make_mocked_request

from maskserve.config.settings import Settings
from maskserve.errors import InvalidHeader
from maskserve.http.app import create_app
from maskserve.request.deadlines import TIMEOUT_HEADER, parse_timeout, request_deadline
from maskserve.request.keys import state_of
from tests.fakes import EchoModel


def test_without_the_header_the_server_default_holds() -> None:
    assert parse_timeout(None, 30.0) == 30.0


def test_a_shorter_timeout_from_the_client_is_taken() -> None:
    assert parse_timeout("2.5", 30.0) == 2.5


def test_a_client_cannot_lengthen_the_timeout() -> None:
    assert parse_timeout("600", 30.0) == 30.0


@pytest.mark.parametrize("header", ["0", "-1", "nan", "inf", "-inf", "soon", "", "1e999"])
def test_a_timeout_that_is_not_a_positive_number_answers_400_naming_the_header(header: str) -> None:
    with pytest.raises(InvalidHeader, match=r"positive number of seconds") as raised:
        parse_timeout(header, 30.0)
    assert (raised.value.status, raised.value.field) == (400, TIMEOUT_HEADER)


async def test_the_deadline_is_the_server_timeout_from_now() -> None:
    app = create_app(Settings(request_timeout=7.0, warmup=False), engine=EchoModel())
    before = asyncio.get_running_loop().time()
    deadline = request_deadline(make_mocked_request("POST", "/", app=app))
    assert before + 7.0 <= deadline <= asyncio.get_running_loop().time() + 7.0


async def test_the_deadline_follows_the_clients_shorter_timeout() -> None:
    app = create_app(Settings(request_timeout=7.0, warmup=False), engine=EchoModel())
    request = make_mocked_request("POST", "/", headers={TIMEOUT_HEADER: "0.5"}, app=app)
    before = asyncio.get_running_loop().time()
    assert before + 0.5 <= request_deadline(request) <= asyncio.get_running_loop().time() + 0.5


async def test_the_deadline_is_computed_once_and_kept_on_the_request() -> None:
    app = create_app(Settings(warmup=False), engine=EchoModel())
    request = make_mocked_request("POST", "/", app=app)
    first = request_deadline(request)
    await asyncio.sleep(0.01)
    assert request_deadline(request) == first == state_of(request).deadline


async def test_a_bad_header_fails_the_deadline_and_leaves_none_set() -> None:
    app = create_app(Settings(warmup=False), engine=EchoModel())
    request = make_mocked_request("POST", "/", headers={TIMEOUT_HEADER: "-2"}, app=app)
    with pytest.raises(InvalidHeader):
        request_deadline(request)
    assert state_of(request).deadline is None
