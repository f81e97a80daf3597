"""The middleware chain: named stages, the ``--middleware`` specification, its checks and its builder.

A stage is a name and a factory ``Callable[[Settings], Middleware | None]``; the chain lists
stages outermost first. A factory may return None to stay out of the chain under these settings
(``auth`` without ``--api-key``, ``cors`` without ``--cors-origins``). A middleware may carry a
``setup_app(app)`` attribute, which ``create_app`` calls once, before the model's own lifecycle is
added: a stage that owns resources for the app's life registers them there (``tracing`` starts
its tracer provider with the app and flushes it after everything else has stopped).

The specification, a comma-separated list read left to right into a list of stages::

    default         the built-in stages below, in their order
    NAME            append this stage here
    -NAME           remove this stage (it must be in the list so far)
    +NAME           add this stage at its own slot, unless it is there already: a built-in at its
                    place among the built-ins; another stage just before circuit_breaker if its
                    factory declares ``reads_body = False``, else innermost (after everything else)

    NAME            a built-in name, a name in the ``maskserve.middleware`` entry-point group,
                    or an import path ``package.module:factory``

An empty specification means ``default``. ``create_app(settings, middlewares=...)`` takes the same
string, or a list whose items are such strings or factories (a factory is appended in place).

Checked before the server starts, each failure naming the item: an unknown name, a factory that
cannot be imported, is not callable or fails, a stage listed twice, and these invariants:

1. ``errors`` and ``circuit_breaker`` are always in the chain.
2. The built-ins keep their relative order (the reasons are given next to BUILTIN_STAGES).
3. Only built-ins marked ``outside_errors`` (they never raise) come before ``errors``: whatever any
   other stage raises reaches the client sanitized.
4. A stage that may read the body comes after ``circuit_breaker``: an overloaded server refuses at
   the door before anyone reads a byte. Other stages may read the body unless their factory
   declares ``reads_body = False``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from maskserve.config.settings import Settings, SettingsError
from maskserve.middleware.auth import auth_middleware, parse_api_keys
from maskserve.middleware.circuit_breaker import circuit_breaker_middleware
from maskserve.middleware.cors import cors_middleware, parse_origins
from maskserve.middleware.error_sanitizer import error_middleware
from maskserve.middleware.request_metrics import metrics_middleware

# The tracing stage's own module imports the OpenTelemetry SDK (maskserve[otel]): it is imported
# only when the stage is on (see _tracing).

MiddlewareFactory = Callable[[Settings], Middleware | None]
ENTRY_POINT_GROUP = "maskserve.middleware"
DEFAULT = "default"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*")


class MiddlewareError(SettingsError):
    """The middleware specification cannot be used; the message names the item and the reason."""


@dataclass(frozen=True)
class Stage:
    """One named stage of the chain and what the order checks need to know about it."""

    name: str
    factory: MiddlewareFactory
    builtin: bool = False
    # Whether the stage may read the request body: then it must come after circuit_breaker.
    reads_body: bool = True
    # Built-ins only: the stage never raises, so it may (and must) wrap the error sanitizer.
    outside_errors: bool = False
    # Built-ins only: None when ``default`` always includes the stage; else whether it does under
    # these settings (tracing only when an exporter is configured). ``+NAME`` adds it regardless.
    in_default: Callable[[Settings], bool] | None = None


def tracing_configured(settings: Settings) -> bool:
    """Whether --traces-exporter / OTEL_TRACES_EXPORTER turns tracing on (set, and not ``none``)."""
    return settings.traces_exporter not in (None, "none")


def _tracing(settings: Settings) -> Middleware:
    try:
        from maskserve.middleware.request_tracing import tracing_middleware
        from maskserve.observability.tracing import exporter_factories
    except ImportError:
        raise ValueError("tracing needs OpenTelemetry: pip install 'maskserve[otel]'") from None
    return tracing_middleware(exporter_factories(settings.traces_exporter))


def check_tracing(settings: Settings) -> None:
    """Start-up's check of --traces-exporter: when it turns tracing on, the SDK and every named
    exporter must be installed."""
    if tracing_configured(settings):
        _tracing(settings)


def _metrics(settings: Settings) -> Middleware:
    return metrics_middleware


def _cors(settings: Settings) -> Middleware | None:
    origins = parse_origins(settings.cors_origins)
    return cors_middleware(origins) if origins else None


def _errors(settings: Settings) -> Middleware:
    return error_middleware


def _auth(settings: Settings) -> Middleware | None:
    keys = parse_api_keys(settings.api_key)
    return auth_middleware(keys) if keys else None


def _circuit_breaker(settings: Settings) -> Middleware:
    return circuit_breaker_middleware


# The built-in stages, outermost first: the default chain.
BUILTIN_STAGES = (
    # Outermost, so its HTTP span covers everything the server does for the request and sees the
    # final status. Off unless an exporter is configured or the chain adds it; never raises.
    Stage("tracing", _tracing, builtin=True, reads_body=False, outside_errors=True, in_default=tracing_configured),
    # Outermost, so it counts and times every response as the client got it, errors and CORS
    # preflights included; it only observes and never raises.
    Stage("metrics", _metrics, builtin=True, reads_body=False, outside_errors=True),
    # Outside the sanitizer, so error responses carry CORS headers too (a page must be able to
    # read a 401 or a 503's Retry-After); before auth, because preflights carry no key.
    # It raises nothing. Off unless --cors-origins is set.
    Stage("cors", _cors, builtin=True, reads_body=False, outside_errors=True),
    # Around everything that can fail, so nothing raised below it reaches a client unsanitized,
    # and every response carries its request id.
    Stage("errors", _errors, builtin=True, reads_body=False),
    # Before the breaker: a caller without the key is refused before it counts against admission,
    # and before any other stage sees its request. Off unless --api-key is set.
    Stage("auth", _auth, builtin=True, reads_body=False),
    # Before any handler or stage reads a body: refusing at the door must cost (almost) nothing.
    Stage("circuit_breaker", _circuit_breaker, builtin=True, reads_body=False),
)
BUILTINS = {stage.name: stage for stage in BUILTIN_STAGES}
REQUIRED = ("errors", "circuit_breaker")


@dataclass(frozen=True)
class Chain:
    """The active chain: the stages that built a middleware, outermost first."""

    names: tuple[str, ...]
    middlewares: tuple[Middleware, ...]


Spec = str | Sequence[str | MiddlewareFactory]


def _fail(item: object, reason: str) -> MiddlewareError:
    return MiddlewareError(f"middleware stage {item!r}: {reason}")


def _custom_stage(name: str, factory: object, item: str) -> Stage:
    if not callable(factory):
        raise _fail(item, f"a {type(factory).__name__} is not callable (a factory takes the settings)")
    reads_body = getattr(factory, "reads_body", True)
    if not isinstance(reads_body, bool):
        raise _fail(item, "the factory's reads_body must be True or False")
    return Stage(name, factory, reads_body=reads_body)


def _import(item: str) -> Stage:
    module_name, _, attribute = item.partition(":")
    try:
        found: object = importlib.import_module(module_name)
    except Exception as exc:  # any error in the operator's module: name it, don't crash on it
        raise _fail(item, f"cannot import {module_name!r} ({type(exc).__name__}: {exc})") from exc
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise _fail(item, f"{module_name!r} has no attribute {attribute!r}") from None
    return _custom_stage(item, found, item)


def _entry_point(item: str) -> Stage:
    group = metadata.entry_points(group=ENTRY_POINT_GROUP)
    found = group.select(name=item)
    if not found:
        plugins = ", ".join(sorted(group.names)) or "none installed"
        raise _fail(item, f"unknown stage (built-ins: {', '.join(BUILTINS)}; entry points: {plugins})")
    entry = next(iter(found))
    try:
        factory = entry.load()
    except Exception as exc:
        raise _fail(item, f"cannot load entry point {entry.value!r} ({type(exc).__name__}: {exc})") from exc
    return _custom_stage(item, factory, item)


def _stage(item: str) -> Stage:
    """The stage an item names: a built-in, an import path, or an entry point."""
    if item in BUILTINS:
        return BUILTINS[item]
    if ":" in item:
        if not _IMPORT_PATH.fullmatch(item):
            raise _fail(item, "an import path reads package.module:factory")
        return _import(item)
    if not _NAME.fullmatch(item):
        raise _fail(item, "not a stage name, an import path (package.module:factory) or 'default'")
    return _entry_point(item)


def _slot(stages: list[Stage], stage: Stage) -> int:
    """Where ``+stage`` goes in ``stages``; see the module docstring."""
    if stage.builtin:
        rank = BUILTIN_STAGES.index(stage)
        later = [i for i, s in enumerate(stages) if s.builtin and BUILTIN_STAGES.index(s) > rank]
        return later[0] if later else len(stages)
    if not stage.reads_body:
        for i, s in enumerate(stages):
            if s.name == "circuit_breaker":
                return i
    return len(stages)


def resolve(spec: Spec, settings: Settings | None = None) -> tuple[Stage, ...]:
    """The stages a specification names, in order; raises :class:`MiddlewareError` when unusable.

    ``settings`` decides which optional built-ins ``default`` holds (none without settings).
    """
    items: Sequence[str | MiddlewareFactory] = spec.split(",") if isinstance(spec, str) else spec
    if isinstance(spec, str) and not spec.strip():
        items = [DEFAULT]
    stages: list[Stage] = []
    for raw in items:
        if callable(raw) and not isinstance(raw, str):
            name = f"{getattr(raw, '__module__', '?')}:{getattr(raw, '__qualname__', type(raw).__name__)}"
            stages.append(_custom_stage(name, raw, name))
            continue
        if not isinstance(raw, str):
            raise _fail(raw, "an item is a stage name or a factory")
        item = raw.strip()
        if item == DEFAULT:
            stages.extend(s for s in BUILTIN_STAGES if s.in_default is None or (settings and s.in_default(settings)))
        elif item.startswith("-"):
            name = item[1:].strip()
            # An optional built-in may be absent (tracing without an exporter): removing it is a no-op.
            if name not in [s.name for s in stages] and not (name in BUILTINS and BUILTINS[name].in_default):
                raise _fail(item, f"{name!r} is not in the chain before it, so it cannot be removed")
            stages = [s for s in stages if s.name != name]
        elif item.startswith("+"):
            stage = _stage(item[1:].strip())
            if stage.name not in [s.name for s in stages]:
                stages.insert(_slot(stages, stage), stage)
        elif item:
            stages.append(_stage(item))
        else:
            raise _fail(raw, "empty item (two commas in a row?)")
        names = [s.name for s in stages]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise _fail(item, f"{duplicates[0]!r} would be in the chain twice")
    check_order(stages)
    return tuple(stages)


def check_order(stages: Sequence[Stage]) -> None:
    """Raise :class:`MiddlewareError` when ``stages`` break an invariant (module docstring)."""
    names = [s.name for s in stages]
    order = ", ".join(names)
    for required in REQUIRED:
        if required not in names:
            raise _fail(required, f"is required and missing from the chain ({order})")
    builtins = [s.name for s in stages if s.builtin]
    expected = [s.name for s in BUILTIN_STAGES if s.name in builtins]
    if builtins != expected:
        raise _fail(order, f"built-in stages must keep their order ({', '.join(expected)}); see docs/middleware.md")
    errors_at = names.index("errors")
    for stage in stages[:errors_at]:
        if not stage.outside_errors:
            raise _fail(stage.name, "must come after errors: what it raises would reach clients unsanitized")
    breaker_at = names.index("circuit_breaker")
    for stage in stages[:breaker_at]:
        if stage.reads_body:
            raise _fail(
                stage.name,
                "may read the request body, so it must come after circuit_breaker (a factory that never "
                "reads it declares reads_body = False)",
            )


def _as_new_style(middleware: Middleware) -> Middleware:
    """aiohttp 3 treats an unmarked callable as an old-style factory: mark a wrapper instead."""
    if getattr(middleware, "__middleware_version__", None) == 1:
        return middleware

    @web.middleware
    async def marked(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await middleware(request, handler)

    return marked


def build_chain(spec: Spec, settings: Settings) -> Chain:
    """Resolve and check ``spec``, then build each stage from ``settings``."""
    names: list[str] = []
    middlewares: list[Middleware] = []
    for stage in resolve(spec, settings):
        try:
            middleware = stage.factory(settings)
        except Exception as exc:  # the operator's factory: name it in the start-up error
            raise _fail(stage.name, f"the factory failed ({type(exc).__name__}: {exc})") from exc
        if middleware is None:
            continue
        if not callable(middleware):
            raise _fail(stage.name, f"the factory returned {type(middleware).__name__}, not a middleware")
        names.append(stage.name)
        middlewares.append(_as_new_style(middleware))
    _check_settings_kept(names, settings)
    return Chain(tuple(names), tuple(middlewares))


def _check_settings_kept(names: Sequence[str], settings: Settings) -> None:
    """A maskserve setting that turns a stage on must find it in the chain: a chain that removed
    ``auth`` while ``--api-key`` is set would serve every route without a key, silently."""
    wanted = (
        ("auth", bool(settings.api_key), "--api-key is set, so every route but the public ones must need the key"),
        ("cors", bool(settings.cors_origins), "--cors-origins is set, so the named pages expect CORS headers"),
    )
    # Not tracing: OTEL_TRACES_EXPORTER is often set for every service on a platform, and
    # ``-tracing`` is how one server opts out of it.
    for stage, configured, reason in wanted:
        if configured and stage not in names:
            raise MiddlewareError(f"the chain ({', '.join(names)}) leaves out {stage!r}, but {reason}")


def check_setting(settings: Settings) -> None:
    """Build the chain ``settings.middleware`` names, as the server will: start-up runs this (via
    ``load_settings(checks=...)``) before a model loads or a port opens, so a bad chain stops it."""
    build_chain(settings.middleware, settings)
