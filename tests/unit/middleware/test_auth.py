"""Bearer-token authentication: 401 with WWW-Authenticate, constant-time compare, health and page open."""

from __future__ import annotations

import hmac
from collections.abc import Callable

import pytest

from maskserve.config.flags import help_text, load_settings
from maskserve.config.settings import Settings
from tests.conftest import ClientFactory
from tests.unit.middleware.test_error_sanitizer import error_of

PARIS = b"paris is the [MASK] of france."
KEY = "k3y-for-tests.0123456789"
OTHER_KEY = "second-key_abcdefghijklmnop"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_without_a_key_setting_everything_is_open(make_client: ClientFactory) -> None:
    client = await make_client()
    assert (await client.post("/", data=PARIS)).status == 200
    assert (await client.get("/info")).status == 200


async def test_a_request_without_the_key_answers_401_with_a_bearer_challenge(make_client: ClientFactory) -> None:
    client = await make_client(api_key=KEY)
    response = await client.post("/", data=PARIS)
    error = await error_of(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="maskserve"'
    assert "Authorization: Bearer" in error["error"]


@pytest.mark.parametrize(
    "header",
    [f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer wrong", f"Basic {KEY}", f"Token {KEY}", "Bearer"],
)
async def test_a_wrong_or_malformed_key_answers_401(make_client: ClientFactory, header: str) -> None:
    client = await make_client(api_key=KEY)
    response = await client.post("/", data=PARIS, headers={"Authorization": header})
    await error_of(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"].startswith("Bearer ")
    assert KEY not in await response.text()


async def test_a_wrong_key_is_told_invalid_token(make_client: ClientFactory) -> None:
    client = await make_client(api_key=KEY)
    response = await client.post("/", data=PARIS, headers=bearer("not-the-key-at-all"))
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="maskserve", error="invalid_token"'


async def test_the_right_key_is_served_whatever_the_scheme_case(make_client: ClientFactory) -> None:
    client = await make_client(api_key=KEY)
    assert (await client.post("/", data=PARIS, headers=bearer(KEY))).status == 200
    assert (await client.post("/", data=PARIS, headers={"Authorization": f"bearer {KEY}"})).status == 200


async def test_every_listed_key_is_accepted_for_rollover(make_client: ClientFactory) -> None:
    client = await make_client(api_key=f"{KEY},{OTHER_KEY}")
    for key in (KEY, OTHER_KEY):
        assert (await client.post("/", data=PARIS, headers=bearer(key))).status == 200
    await error_of(await client.post("/", data=PARIS, headers=bearer(f"{KEY},{OTHER_KEY}")), 401, "unauthorized")


async def test_keys_are_compared_in_constant_time(make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real: Callable[[bytes, bytes], bool] = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    client = await make_client(api_key=f"{KEY},{OTHER_KEY}")
    assert (await client.post("/", data=PARIS, headers=bearer(KEY))).status == 200
    # Every key is compared, even after the first one matched.
    assert compared == [(KEY.encode(), KEY.encode()), (KEY.encode(), OTHER_KEY.encode())]


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/", "/static/demo.css", "/demo"])
async def test_health_and_the_page_stay_open_with_a_key_set(make_client: ClientFactory, path: str) -> None:
    client = await make_client(api_key=KEY)
    response = await client.get(path, allow_redirects=False)
    assert response.status in (200, 303)


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/"), ("POST", "/demo"), ("GET", "/info"), ("GET", "/metrics"), ("GET", "/no/such/path")],
)
async def test_the_api_info_metrics_the_form_and_unknown_paths_need_the_key(
    make_client: ClientFactory, method: str, path: str
) -> None:
    client = await make_client(api_key=KEY)
    await error_of(await client.request(method, path, data=b"text=x"), 401, "unauthorized")
    assert (await client.request(method, path, data=b"text=x", headers=bearer(KEY))).status != 401


async def test_the_key_never_shows_in_info_repr_or_help(make_client: ClientFactory) -> None:
    settings = load_settings([], env={"MASKSERVE_API_KEY": KEY})
    assert settings.api_key == KEY
    assert KEY not in repr(settings) and KEY not in str(Settings(api_key=KEY))
    assert KEY not in help_text()
    client = await make_client(api_key=KEY)
    assert KEY not in await (await client.get("/info", headers=bearer(KEY))).text()
