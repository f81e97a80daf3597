"""The middleware chain: the specification, its checks at start-up, and custom stages in place."""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from maskserve.config.flags import load_settings
from maskserve.config.settings import Settings, SettingsError
from maskserve.engine import FillMaskEngine
from maskserve.errors import INTERNAL_MESSAGE, MaskserveError
from maskserve.http.app import SETTINGS_CHECKS, create_app
from maskserve.middleware.chain import BUILTIN_STAGES, ENTRY_POINT_GROUP, MiddlewareError, build_chain, resolve
from maskserve.request.keys import state_of
from tests.conftest import ClientFactory
from tests.fakes import default_parts
from tests.live_server import run_maskserve
from tests.unit.middleware.test_error_sanitizer import error_of

PARIS = b"paris is the [MASK] of france."
KEY = "test-key-0123456789abcdef"
HERE = __name__  # custom stages below are named by import path: f"{HERE}:first"

# What the recording stages saw, in order; cleared before each test.
EVENTS: list[str] = []


@pytest.fixture(autouse=True)
def _clear_events() -> None:
    EVENTS.clear()


class Recorder:
    """A stage factory whose middleware records each request it sees and how it left."""

    def __init__(self, label: str, *, reads_body: bool = True) -> None:
        self.label = label
        self.reads_body = reads_body

    def __call__(self, settings: Settings) -> Middleware:
        label = self.label

        @web.middleware
        async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
            # Inside the error sanitizer, the request id is already assigned.
            EVENTS.append(f"{label} in" + (" with id" if state_of(request).id != "-" else ""))
            try:
                response = await handler(request)
            except MaskserveError as exc:
                EVENTS.append(f"{label} raised {exc.kind}")
                raise
            EVENTS.append(f"{label} out {response.status}")
            response.headers[f"X-Seen-By-{label}"] = "yes"
            return response

        return record


first = Recorder("first")
second = Recorder("second")
reads_nothing = Recorder("reads_nothing", reads_body=False)
NOT_CALLABLE = 42


def explodes(settings: Settings) -> Middleware:
    @web.middleware
    async def explode(request: web.Request, handler: Handler) -> web.StreamResponse:
        raise RuntimeError("secret /srv/models/private-bert token=hunter2")

    return explode


def factory_fails(settings: Settings) -> Middleware:
    raise ValueError("RATE must be a number")


def returns_a_string(settings: Settings) -> Any:
    return "not a middleware"


def unmarked(settings: Settings) -> Middleware:
    """A plain coroutine function without ``@web.middleware``: the chain marks it."""

    async def plain(request: web.Request, handler: Handler) -> web.StreamResponse:
        EVENTS.append("unmarked in")
        return await handler(request)

    return plain


def names(spec: str, **settings: Any) -> tuple[str, ...]:
    return build_chain(spec, Settings(**settings)).names


# -- the specification ----------------------------------------------------------------------------


def test_default_chain_is_the_builtins_in_order_with_auth_and_cors_off_until_configured() -> None:
    assert [s.name for s in BUILTIN_STAGES] == ["tracing", "metrics", "cors", "errors", "auth", "circuit_breaker"]
    assert names("default") == ("metrics", "errors", "circuit_breaker")
    assert names("") == names("default")
    configured = names("default", api_key=KEY, cors_origins="https://app.example.com")
    assert configured == ("metrics", "cors", "errors", "auth", "circuit_breaker")


def test_minus_removes_a_stage_and_plus_puts_a_builtin_back_in_its_place() -> None:
    assert names("default,-metrics") == ("errors", "circuit_breaker")
    assert names("default,-metrics,-auth,+auth,+metrics", api_key=KEY) == (
        "metrics",
        "errors",
        "auth",
        "circuit_breaker",
    )


def test_tracing_is_in_the_default_chain_only_with_an_exporter_and_plus_adds_it_once() -> None:
    assert "tracing" not in names("default", traces_exporter="none")
    assert names("default", traces_exporter="console")[0] == "tracing"
    assert names("default,+tracing")[0] == "tracing"
    assert names("default,+tracing", traces_exporter="console").count("tracing") == 1
    assert names("default,-tracing", traces_exporter="console") == ("metrics", "errors", "circuit_breaker")
    assert names("default,-tracing") == ("metrics", "errors", "circuit_breaker")  # absent: nothing to remove


def test_plus_puts_a_stage_that_reads_no_body_before_the_breaker_and_others_innermost() -> None:
    chain = names(f"default,+{HERE}:first,+{HERE}:reads_nothing", api_key=KEY)
    assert chain == ("metrics", "errors", "auth", f"{HERE}:reads_nothing", "circuit_breaker", f"{HERE}:first")


def test_a_plain_item_is_appended_where_it_is_written() -> None:
    spec = f"errors,auth,{HERE}:reads_nothing,circuit_breaker,{HERE}:second,{HERE}:first"
    assert names(spec, api_key=KEY) == ("errors", "auth", f"{HERE}:reads_nothing", "circuit_breaker") + (
        f"{HERE}:second",
        f"{HERE}:first",
    )


@pytest.mark.parametrize(
    ("spec", "names_item", "reason"),
    [
        ("default,nosuch", "nosuch", "unknown stage"),
        ("default,+no_such_module_xyz:factory", "no_such_module_xyz:factory", "cannot import"),
        (f"default,+{HERE}:missing", f"{HERE}:missing", "has no attribute"),
        (f"default,+{HERE}:NOT_CALLABLE", f"{HERE}:NOT_CALLABLE", "not callable"),
        ("default,+a:b:c", "a:b:c", "package.module:factory"),
        ("default,+bad name", "bad name", "not a stage name"),
        ("default,-errors", "errors", "required"),
        ("default,-circuit_breaker", "circuit_breaker", "required"),
        ("circuit_breaker,errors", "circuit_breaker, errors", "keep their order"),
        ("default,cors", "cors", "twice"),
        ("default,-nosuch", "-nosuch", "not in the chain"),
        ("default,,metrics", "", "empty item"),
        (f"{HERE}:reads_nothing,default", f"{HERE}:reads_nothing", "must come after errors"),
        (f"errors,{HERE}:first,circuit_breaker", f"{HERE}:first", "must come after circuit_breaker"),
        (f"default,+{HERE}:factory_fails", f"{HERE}:factory_fails", "factory failed (ValueError: RATE"),
        (f"default,+{HERE}:returns_a_string", f"{HERE}:returns_a_string", "not a middleware"),
    ],
)
def test_a_bad_specification_is_refused_naming_the_item(spec: str, names_item: str, reason: str) -> None:
    with pytest.raises(MiddlewareError) as caught:
        create_app(Settings(), middlewares=spec)
    assert f"middleware stage {names_item!r}" in str(caught.value)
    assert reason in str(caught.value)


def test_start_up_settings_check_the_chain_and_name_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"^MASKSERVE_MIDDLEWARE: middleware stage 'nosuch': unknown stage"):
        load_settings([], env={"MASKSERVE_MIDDLEWARE": "default,nosuch"}, checks=SETTINGS_CHECKS)
    with pytest.raises(SettingsError, match=r"^--middleware: .*must come after errors"):
        load_settings(["--middleware", f"{HERE}:first,default"], env={}, checks=SETTINGS_CHECKS)


def test_settings_alone_never_build_the_chain() -> None:
    """The settings sit below the middleware layer: parsing keeps the value, start-up checks it."""
    assert load_settings([], env={"MASKSERVE_MIDDLEWARE": "default,nosuch"}).middleware == "default,nosuch"


def test_cli_exits_2_on_a_bad_chain_before_loading_any_model() -> None:
    result = run_maskserve("--model", "/no/such/model", "--middleware", "default,-errors", timeout_s=60)
    assert result.returncode == 2
    assert "--middleware: middleware stage 'errors': is required" in result.stderr
    assert "Traceback" not in result.stderr


def test_entry_point_stages_load_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.metadata.EntryPoints(
        [importlib.metadata.EntryPoint(name="audit", value=f"{HERE}:reads_nothing", group=ENTRY_POINT_GROUP)]
    )

    def entry_points(*, group: str) -> importlib.metadata.EntryPoints:
        return found if group == ENTRY_POINT_GROUP else importlib.metadata.EntryPoints([])

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert names("default,+audit") == ("metrics", "errors", "audit", "circuit_breaker")
    with pytest.raises(MiddlewareError, match=r"unknown stage .*entry points: audit\)"):
        resolve("default,+auditt")


# -- custom stages through the real app -----------------------------------------------------------


async def test_custom_stages_see_requests_and_responses_in_chain_order(make_client: ClientFactory) -> None:
    client = await make_client(middleware=f"default,{HERE}:first,{HERE}:second")
    response = await client.post("/", data=PARIS)
    assert response.status == 200
    assert response.headers["X-Seen-By-first"] == response.headers["X-Seen-By-second"] == "yes"
    assert EVENTS == ["first in with id", "second in with id", "second out 200", "first out 200"]
    info = await (await client.get("/info")).json()
    assert info["middleware"] == ["metrics", "errors", "circuit_breaker", f"{HERE}:first", f"{HERE}:second"]


async def test_stages_sit_after_auth_and_around_the_breaker_as_declared(make_client: ClientFactory) -> None:
    client = await make_client(middleware=f"default,+{HERE}:first,+{HERE}:reads_nothing", api_key=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    # Without the key, auth refuses before either custom stage sees the request.
    assert (await client.post("/", data=PARIS)).status == 401
    assert EVENTS == []
    # A refusal at the door: the stage before the breaker sees it raised; the one after never runs.
    default_parts(client).batcher.close()
    await error_of(await client.post("/", data=PARIS, headers=auth), 503, "shutting_down")
    assert EVENTS == ["reads_nothing in with id", "reads_nothing raised shutting_down"]
    info = await (await client.get("/info", headers=auth)).json()
    assert info["middleware"] == [
        "metrics",
        "errors",
        "auth",
        f"{HERE}:reads_nothing",
        "circuit_breaker",
        f"{HERE}:first",
    ]


async def test_create_app_takes_a_list_of_names_and_factories(aiohttp_client: Any, bert_engine: FillMaskEngine) -> None:
    app = create_app(Settings(), engine=bert_engine, middlewares=["default", "-metrics", unmarked])
    client = await aiohttp_client(app)
    assert (await client.post("/", data=PARIS)).status == 200
    assert EVENTS == ["unmarked in"]
    info = await (await client.get("/info")).json()
    assert info["middleware"] == ["errors", "circuit_breaker", f"{HERE}:unmarked"]


async def test_an_unmarked_middleware_works_without_deprecation_warnings(make_client: ClientFactory) -> None:
    # pytest turns warnings into errors: aiohttp's old-style warning would fail this test.
    client = await make_client(middleware=f"default,{HERE}:unmarked")
    assert (await client.post("/", data=PARIS)).status == 200
    assert EVENTS == ["unmarked in"]


async def test_a_disabled_builtin_is_really_gone(make_client: ClientFactory) -> None:
    client = await make_client(middleware="default,-metrics")
    assert (await client.post("/", data=PARIS)).status == 200
    info = await (await client.get("/info")).json()
    assert info["middleware"] == ["errors", "circuit_breaker"]
    assert b"maskserve_requests_total{" not in await (await client.get("/metrics")).read()


@pytest.mark.parametrize(
    ("spec", "setting", "stage"),
    [
        ("default,-auth", {"api_key": KEY}, "auth"),
        ("default,-cors", {"cors_origins": "https://app.example.com"}, "cors"),
        ("metrics,errors,circuit_breaker", {"api_key": KEY}, "auth"),
    ],
)
def test_a_chain_without_the_stage_a_setting_turns_on_is_refused(
    spec: str, setting: dict[str, str], stage: str
) -> None:
    with pytest.raises(MiddlewareError, match=f"leaves out {stage!r}"):
        create_app(Settings(**setting), middlewares=spec)  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=r"^--middleware: the chain .* leaves out"):
        flags = [item for name, value in setting.items() for item in ("--" + name.replace("_", "-"), value)]
        load_settings(["--middleware", spec, *flags], env={}, checks=SETTINGS_CHECKS)


async def test_an_error_raised_in_a_custom_stage_is_sanitized(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(middleware=f"default,{HERE}:explodes")
    with caplog.at_level(logging.ERROR, logger="maskserve"):
        response = await client.post("/", data=PARIS)
    error = await error_of(response, 500, "internal")
    assert error["error"] == INTERNAL_MESSAGE
    text = await response.text()
    for leak in ("secret", "/srv", "hunter2", "RuntimeError", "Traceback"):
        assert leak not in text
    # The operator still gets the whole story, under the request id.
    assert "hunter2" in caplog.text and error["request_id"] in caplog.text
