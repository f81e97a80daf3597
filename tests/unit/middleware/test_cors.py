"""CORS: off by default; with --cors-origins, preflights answered and allowed origins let in only."""

from __future__ import annotations

import pytest

from maskserve.config.flags import load_settings
from maskserve.config.settings import SettingsError
from tests.conftest import ClientFactory
from tests.fakes import default_parts
from tests.unit.middleware.test_error_sanitizer import error_of

PARIS = b"paris is the [MASK] of france."
APP = "https://app.example.com"
KEY = "k3y-for-tests.0123456789"
PREFLIGHT = {"Origin": APP, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}


async def test_cors_is_off_by_default(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/", data=PARIS, headers={"Origin": APP})
    assert response.status == 200
    assert not any(h.startswith("Access-Control-") for h in response.headers)
    preflight = await client.options("/", headers=PREFLIGHT)
    assert preflight.status == 405
    assert "Access-Control-Allow-Origin" not in preflight.headers


async def test_a_preflight_from_an_allowed_origin_is_answered_without_a_key(make_client: ClientFactory) -> None:
    client = await make_client(cors_origins=APP, api_key=KEY)
    response = await client.options("/", headers=PREFLIGHT)
    assert response.status == 204
    assert response.headers["Access-Control-Allow-Origin"] == APP
    assert set(response.headers["Access-Control-Allow-Methods"].split(", ")) == {"GET", "POST"}
    assert "Authorization" in response.headers["Access-Control-Allow-Headers"]
    assert "Content-Type" in response.headers["Access-Control-Allow-Headers"]
    assert int(response.headers["Access-Control-Max-Age"]) > 0
    assert response.headers["Vary"] == "Origin"


async def test_an_allowed_origin_can_read_answers_and_their_timing(make_client: ClientFactory) -> None:
    client = await make_client(cors_origins=f"https://other.example.org,{APP}")
    response = await client.post("/", data=PARIS, headers={"Origin": APP})
    assert response.status == 200
    assert response.headers["Access-Control-Allow-Origin"] == APP
    exposed = response.headers["Access-Control-Expose-Headers"].split(", ")
    assert {"Retry-After", "X-Request-Id", "X-Queue-Time-Ms"} <= set(exposed)


async def test_errors_carry_cors_headers_so_a_page_can_read_them(make_client: ClientFactory) -> None:
    client = await make_client(cors_origins=APP, api_key=KEY)
    response = await client.post("/", data=PARIS, headers={"Origin": APP})
    await error_of(response, 401, "unauthorized")
    assert response.headers["Access-Control-Allow-Origin"] == APP
    default_parts(client).batcher.close()
    refused = await client.post("/", data=PARIS, headers={"Origin": APP, "Authorization": f"Bearer {KEY}"})
    await error_of(refused, 503, "shutting_down")
    assert refused.headers["Access-Control-Allow-Origin"] == APP
    assert "Retry-After" in refused.headers["Access-Control-Expose-Headers"]


async def test_another_origin_gets_no_cors_headers(make_client: ClientFactory) -> None:
    client = await make_client(cors_origins=APP)
    evil = "https://evil.example.net"
    response = await client.post("/", data=PARIS, headers={"Origin": evil})
    assert "Access-Control-Allow-Origin" not in response.headers
    preflight = await client.options("/", headers={**PREFLIGHT, "Origin": evil})
    assert preflight.status != 204
    assert "Access-Control-Allow-Origin" not in preflight.headers


async def test_a_wildcard_allows_any_origin_without_vary(make_client: ClientFactory) -> None:
    client = await make_client(cors_origins="*")
    response = await client.post("/", data=PARIS, headers={"Origin": "https://anywhere.example"})
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    assert "Vary" not in response.headers


async def test_info_lists_cors_only_when_configured(make_client: ClientFactory) -> None:
    on = await make_client(cors_origins=APP)
    assert "cors" in (await (await on.get("/info")).json())["middleware"]
    off = await make_client()
    assert "cors" not in (await (await off.get("/info")).json())["middleware"]


@pytest.mark.parametrize("origins", ["https://app.example.com/", "app.example.com", "https://app.example.com/path"])
def test_an_origin_that_is_not_scheme_host_port_is_refused(origins: str) -> None:
    with pytest.raises(SettingsError, match="--cors-origins: invalid value"):
        load_settings(["--cors-origins", origins], env={})


def test_origins_are_normalised_to_lower_case_without_spaces() -> None:
    settings = load_settings([], env={"MASKSERVE_CORS_ORIGINS": " HTTPS://App.Example.com , http://localhost:3000"})
    assert settings.cors_origins == "https://app.example.com,http://localhost:3000"
