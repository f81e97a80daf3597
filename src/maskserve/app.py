"""The app factory: shared state, lifecycle, middlewares and routes, wired in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

import aiohttp_jinja2
import jinja2
from aiohttp import web

from .admission import Admission
from .agent import agent_context
from .batcher import Batcher
from .errors import ShuttingDown
from .health import ready
from .keys import SERVICE_KEY
from .middleware import chain
from .middleware.chain import Spec, build_chain
from .middleware.connections import connections_middleware
from .model_api import FillMaskModel, ModelSpec
from .page import security_headers
from .routes import setup_routes
from .service import FillMaskService, Loaded
from .settings import Settings, SettingsCheck

log = logging.getLogger(__name__)

# What start-up checks beyond each value's own parsing, before a model loads or a port opens:
# ``load_settings(argv, checks=SETTINGS_CHECKS)``. Each check belongs to the layer that uses the
# setting and is handed down from here, so the settings never import what sits above them.
SETTINGS_CHECKS: dict[str, SettingsCheck] = {
    "traces_exporter": chain.check_tracing,
    "middleware": chain.check_setting,
}


def model_spec(settings: Settings) -> ModelSpec:
    """The model the settings name, and how to load it."""
    return ModelSpec(
        model=settings.model,
        backend=settings.backend,
        cache_dir=settings.resolved_cache_dir(),
        device=settings.device,
        dtype=settings.dtype,
        threads=settings.resolved_threads(),
        adaptive_threads=settings.adaptive_threads,
        quantize=settings.quantize,
    )


def load_model(settings: Settings) -> FillMaskModel:
    """Load the engine named by the settings. Imported lazily: the HTTP side never imports torch."""
    from .engine import load

    return load(model_spec(settings))


def inference_thread() -> ThreadPoolExecutor:
    """The one inference thread: the model never runs two batches at once, and torch's own
    intra-op threads (sized to the cores we have) do the parallel work.

    Load the model on it too (``submit(load_model, settings)``): torch keeps thread-local state
    (its OpenMP team, the thread counts it set), and a model loaded on one thread and run on
    another runs measurably slower per text (``benchmarks/profile_request.py`` shows it).
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="maskserve-inference")


def inference_context(
    model: FillMaskModel | None, thread: ThreadPoolExecutor | None = None
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """One owner for the model, the inference thread and the batch loop."""

    @contextlib.asynccontextmanager
    async def context(app: web.Application) -> AsyncIterator[None]:
        service = app[SERVICE_KEY]
        settings = service.settings
        executor = thread or inference_thread()
        loop = asyncio.get_running_loop()
        loaded = model if model is not None else await loop.run_in_executor(executor, load_model, settings)
        batcher = Batcher(loaded, executor, settings)
        if settings.warmup:
            # Before the port opens and before the metrics look: its passes are no one's requests.
            seconds = await batcher.warm_up(settings.max_top_k)
            log.info(
                "warmed up in %.2fs: the longest batch the limits admit would take about %.1fs here; "
                "stall budget %.1fs",
                seconds,
                batcher.calibrated_longest_s,
                batcher.stall_budget(settings.stall_timeout),
            )
        # One thread, so that tokenizing long texts takes at most one core from the model.
        tokenizer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maskserve-tokenizer")
        admission = Admission(batcher)
        task = asyncio.create_task(batcher.run(), name="maskserve-batch-loop")
        service.loaded = Loaded(loaded, batcher, admission, tokenizer, task)
        service.metrics.attach(batcher, admission, settings.model_name, ready=lambda: ready(service).ok)
        try:
            yield
        finally:
            batcher.close()
            batcher.fail_pending(ShuttingDown("the server stopped before this request ran"))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            tokenizer.shutdown(wait=False, cancel_futures=True)
            if thread is None:  # a thread handed in is its caller's to stop
                # Don't wait for a hung forward pass: the process is leaving anyway.
                executor.shutdown(wait=False, cancel_futures=True)

    return context


async def close_connections_while_draining(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: once draining, every response asks its client to reconnect.

    The next request of a keep-alive client then opens a new connection, which the load balancer
    sends elsewhere, instead of racing the listener's close on this one.
    """
    if request.app[SERVICE_KEY].lifecycle.draining:
        response.force_close()
        # aiohttp has already written its keep-alive decision into the headers by now.
        response.headers["Connection"] = "close"


async def drain_on_shutdown(app: web.Application) -> None:
    """The listener has closed (after the drain delay): refuse new work, finish what was accepted
    within the drain budget."""
    service = app[SERVICE_KEY]
    service.lifecycle.start_draining()  # for an app stopped without the runner's signals
    batcher = service.batcher
    batcher.close()
    settings = service.settings
    log.info(
        "shutting down: draining %d queued texts%s (budget %.1fs)",
        batcher.depth,
        " and the batch in flight" if batcher.busy else "",
        settings.drain_timeout,
    )
    if not await batcher.drain(settings.drain_timeout):
        refused = batcher.fail_pending(ShuttingDown("the server stopped before this request ran"))
        log.warning("drain budget of %.1fs spent; answered %d queued requests 503", settings.drain_timeout, refused)


def create_app(
    settings: Settings,
    *,
    engine: FillMaskModel | None = None,
    thread: ThreadPoolExecutor | None = None,
    middlewares: Spec | None = None,
) -> web.Application:
    """Build the server. Without ``engine``, the model named in ``settings`` is loaded at start-up,
    on the inference thread. An ``engine`` loaded beforehand should come with the
    :func:`inference_thread` it was loaded on, as ``thread``, which stays its caller's to shut down.

    ``middlewares`` overrides ``settings.middleware`` with the same specification, as a string or
    a list of names and factories (see :mod:`maskserve.middleware.chain`, where the built-in stages
    and their order are declared); a bad one raises ``MiddlewareError`` here, before any serving.
    """
    chain = build_chain(settings.middleware if middlewares is None else middlewares, settings)
    # The connection stage comes before the chain and is not a stage of it: it belongs to the
    # server's connections (their write timeout, and the head's timer, which needs to know when
    # each request is served), so no specification may leave it out or move it.
    app = web.Application(
        middlewares=[connections_middleware, *chain.middlewares], client_max_size=settings.max_body_bytes
    )
    app[SERVICE_KEY] = FillMaskService(settings, chain.names)
    # Stages that own resources for the app's life register them first, so that they are set up
    # before the model's lifecycle and torn down after it (see middleware/chain.py).
    for middleware in chain.middlewares:
        setup_app = getattr(middleware, "setup_app", None)
        if callable(setup_app):
            setup_app(app)
    app.cleanup_ctx.append(inference_context(engine, thread))
    if settings.agent_port:
        app.cleanup_ctx.append(agent_context(settings.agent_port))
    app.on_shutdown.append(drain_on_shutdown)
    # The demo page's templates, from the package; autoescape on, and a missing variable is an
    # error rather than an empty string.
    aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("maskserve", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    # CSP on HTML, nosniff and Referrer-Policy everywhere (static files and errors included).
    app.on_response_prepare.append(security_headers)
    app.on_response_prepare.append(close_connections_while_draining)
    setup_routes(app)
    return app
