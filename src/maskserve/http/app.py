"""The app factory: shared state, lifecycle, middlewares and routes, wired in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import aiohttp_jinja2
import jinja2
from aiohttp import web

from maskserve.config.flags import SettingsCheck
from maskserve.config.model_configs import check as check_models
from maskserve.config.model_configs import model_configs
from maskserve.config.model_settings import ModelConfig, model_spec
from maskserve.config.settings import Settings
from maskserve.demo.page import security_headers
from maskserve.errors import ModelLoadFailed, ShuttingDown
from maskserve.http.agent import agent_context
from maskserve.http.routes import ROUTES, Route, setup_routes
from maskserve.middleware import chain
from maskserve.middleware.chain import Spec, build_chain
from maskserve.middleware.slow_clients import connections_middleware
from maskserve.model_api import FillMaskModel
from maskserve.request.keys import SERVICE_KEY
from maskserve.service.health import ready
from maskserve.service.model_control import ModelControl
from maskserve.service.model_loader import LoadEngine
from maskserve.service.registry import FillMaskService, Loaded
from maskserve.serving.memory import IdleTrimmer, models_memory_budget, release_freed_memory
from maskserve.serving.scheduler import Scheduler

if TYPE_CHECKING:
    from maskserve.rpc.server import GrpcServer

log = logging.getLogger(__name__)

# What start-up checks beyond each value's own parsing, before a model loads or a port opens:
# ``load_settings(argv, checks=SETTINGS_CHECKS)``. Each check belongs to the layer that uses the
# setting and is handed down from here, so the settings never import what sits above them.
SETTINGS_CHECKS: dict[str, SettingsCheck] = {
    "traces_exporter": chain.check_tracing,
    "middleware": chain.check_setting,
    "model": check_models,
    # A share of the container's memory needs a container limit to take it of: refused at start.
    "models_memory": models_memory_budget,
}


def load_engine(config: ModelConfig, *, alone: bool = False) -> FillMaskModel:
    """Load one model. Imported lazily: the HTTP side never imports torch. A model that cannot be
    served as asked raises the engine's refusal; its message names the model unless it is the
    server's only one (``alone``), whose refusal reads as before there were several."""
    from maskserve.engine import BackendUnavailable, ModelLoadError, load

    try:
        return load(model_spec(config))
    except (ModelLoadError, BackendUnavailable) as exc:
        if alone:
            raise
        raise type(exc)(f"model {config.name!r}: {exc}") from exc


def load_models(configs: Sequence[ModelConfig]) -> dict[str, FillMaskModel]:
    """Load every model, in order, by name; a refusal stops the start."""
    return {config.name: load_engine(config, alone=len(configs) == 1) for config in configs}


def engine_loader(engines: Mapping[str, FillMaskModel] | None, alone: bool) -> LoadEngine:
    """How the model control loads an engine. At start, the engines handed in (tests, benchmarks)
    stand for the models named at start, and a refusal stops the start-up as the engine raised it;
    while serving, a refusal becomes the load's failure, with its reason for the repository index."""

    def load(config: ModelConfig, at_start: bool) -> FillMaskModel:
        from maskserve.engine import BackendUnavailable, ModelLoadError

        if at_start and engines is not None:
            return engines[config.name]
        try:
            return load_engine(config, alone=at_start and alone)
        except (ModelLoadError, BackendUnavailable) as exc:
            if at_start:
                raise
            raise ModelLoadFailed(str(exc)) from exc

    return load


def import_engine() -> None:
    """The engine's libraries, imported before the first load is measured: their one-time cost is
    the runtime's, not the first model's."""
    import maskserve.engine  # noqa: F401


def load_model(settings: Settings) -> FillMaskModel:
    """Load the (first) model the settings name; see :func:`load_models`."""
    return next(iter(load_models(model_configs(settings)[:1]).values()))


def inference_thread() -> ThreadPoolExecutor:
    """The one inference thread: the model never runs two batches at once, and torch's own
    intra-op threads (sized to the cores we have) do the parallel work. Models load elsewhere (the
    model control's loads): the engine sets its thread count on the thread that runs each pass."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="maskserve-inference")


def worker_budget(settings: Settings) -> int | None:
    """This process's share of ``--models-memory``: with ``--workers N`` every worker holds its own
    copy of every model it serves, so each may hold a ``1/N`` share and the server together never
    passes the budget."""
    budget = models_memory_budget(settings)
    return None if budget is None else budget // max(1, settings.workers)


def inference_context(
    engines: Mapping[str, FillMaskModel] | None, thread: ThreadPoolExecutor | None = None
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """One owner for the models, the inference thread and the batch loop."""

    @contextlib.asynccontextmanager
    async def context(app: web.Application) -> AsyncIterator[None]:
        service = app[SERVICE_KEY]
        executor = thread or inference_thread()
        loop = asyncio.get_running_loop()
        scheduler = Scheduler(executor)
        # One thread, so that tokenizing long texts takes at most one core from the models.
        tokenizer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maskserve-tokenizer")
        task = asyncio.create_task(scheduler.run(), name="maskserve-batch-loop")
        service.loaded = Loaded(scheduler, task)
        control = service.control = ModelControl(
            service.table,
            scheduler,
            tokenizer,
            engine_loader(engines, alone=len(service.models) == 1),
            budget_bytes=worker_budget(service.settings),
            prepare=None if engines is not None else import_engine,
        )
        try:
            # The models named at start take the one load path every model takes (model_control).
            await control.start()
        except BaseException:
            task.cancel()
            tokenizer.shutdown(wait=False, cancel_futures=True)
            if thread is None:
                executor.shutdown(wait=False, cancel_futures=True)
            raise
        service.metrics.watch_models(control.models_state)
        service.metrics.watch_readiness(lambda: ready(service).ok)
        # What loading and warming up freed goes back to the system now, and what traffic frees
        # once the forward passes stop for a while (serving/memory.py says why not sooner).
        await loop.run_in_executor(None, release_freed_memory)
        trimmer = asyncio.create_task(IdleTrimmer(lambda: scheduler.batches_run).run(), name="maskserve-idle-trim")
        try:
            yield
        finally:
            scheduler.close()
            trimmer.cancel()
            await control.close()
            for lane in scheduler.lanes:
                lane.fail_pending(ShuttingDown("the server stopped before this request ran"))
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


# What a call still in flight once the drain is over gets to finish: its answer is being written,
# or it is a stream or a health watch a client keeps open, which would otherwise hold the exit.
GRPC_STOP_GRACE_S = 1.0
GRPC_KEY: web.AppKey[GrpcServer] = web.AppKey("grpc")


async def grpc_context(app: web.Application) -> AsyncIterator[None]:
    """The gRPC server (``--grpc-port``) for the app's life: started in the app's loop once the
    models are loaded, stopped once the drain is over.

    It keeps listening through the drain, as HTTP keeps its open connections: a call that comes
    once intake has closed is answered UNAVAILABLE (shutting down, with a retry pushback), which
    gRPC clients retry elsewhere, rather than cut off; the calls already queued are answered.
    """
    from maskserve.rpc.server import GrpcServer  # grpcio only when the port is asked for

    service = app[SERVICE_KEY]
    spans = None
    if "tracing" in service.middleware:
        from maskserve.middleware.request_tracing import TRACING_KEY
        from maskserve.rpc.tracing import RpcSpans

        spans = RpcSpans(app[TRACING_KEY].tracing)
    server = app[GRPC_KEY] = GrpcServer(service, spans=spans, reuse_port=service.settings.workers > 1)
    await server.start()
    try:
        yield
    finally:
        await server.stop(GRPC_STOP_GRACE_S)


async def drain_on_shutdown(app: web.Application) -> None:
    """The listener has closed (after the drain delay): refuse new work, finish what was accepted
    within the drain budget."""
    service = app[SERVICE_KEY]
    service.lifecycle.start_draining()  # for an app stopped without the runner's signals
    scheduler = service.scheduler
    scheduler.close()
    settings = service.settings
    log.info(
        "shutting down: draining %d queued texts%s (budget %.1fs)",
        scheduler.depth,
        " and the batch in flight" if scheduler.in_flight is not None else "",
        settings.drain_timeout,
    )
    if not await scheduler.drain(settings.drain_timeout):
        stopped = ShuttingDown("the server stopped before this request ran")
        refused = sum(lane.fail_pending(stopped) for lane in scheduler.lanes)
        log.warning("drain budget of %.1fs spent; answered %d queued requests 503", settings.drain_timeout, refused)


def create_app(
    settings: Settings,
    *,
    engine: FillMaskModel | None = None,
    engines: Mapping[str, FillMaskModel] | None = None,
    thread: ThreadPoolExecutor | None = None,
    middlewares: Spec | None = None,
    routes: Sequence[Route] = ROUTES,
) -> web.Application:
    """Build the server. Without ``engine`` or ``engines``, the models named in ``settings`` are
    loaded at start-up, on the inference thread. Models loaded beforehand come as ``engines`` (by
    the names the settings give them) or, for a server of one model, as ``engine``; they should
    come with the :func:`inference_thread` they were loaded on, as ``thread``, which stays its
    caller's to shut down.

    ``middlewares`` overrides ``settings.middleware`` with the same specification, as a string or
    a list of names and factories (see :mod:`maskserve.middleware.chain`, where the built-in stages
    and their order are declared); a bad one raises ``MiddlewareError`` here, before any serving.

    ``routes`` is the route table served: the server's own (``http/routes.py``), or a caller's that
    adds to it (a task of one's own: see the architecture docs).
    """
    chain = build_chain(settings.middleware if middlewares is None else middlewares, settings)
    # The connection stage comes before the chain and is not a stage of it: it belongs to the
    # server's connections (their write timeout, and the head's timer, which needs to know when
    # each request is served), so no specification may leave it out or move it.
    app = web.Application(
        middlewares=[connections_middleware, *chain.middlewares], client_max_size=settings.max_body_bytes
    )
    service = app[SERVICE_KEY] = FillMaskService(settings, chain.names)
    if engine is not None:
        if engines is not None or len(service.models) != 1:
            raise ValueError("engine= serves a server of one model; give several as engines=")
        engines = {service.default.name: engine}
    if engines is not None and list(engines) != list(service.models):
        raise ValueError(f"engines= names {list(engines)}, but the settings serve {list(service.models)}")
    # Stages that own resources for the app's life register them first, so that they are set up
    # before the model's lifecycle and torn down after it (see middleware/chain.py).
    for middleware in chain.middlewares:
        setup_app = getattr(middleware, "setup_app", None)
        if callable(setup_app):
            setup_app(app)
    app.cleanup_ctx.append(inference_context(engines, thread))
    if settings.agent_port:
        app.cleanup_ctx.append(agent_context(settings.agent_port))
    if settings.grpc_port:
        # After the models' context: no call is taken before they are loaded, and the server
        # stops before they go.
        app.cleanup_ctx.append(grpc_context)
    app.on_shutdown.append(drain_on_shutdown)
    # The demo page's templates, from the package; autoescape on, and a missing variable is an
    # error rather than an empty string.
    aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("maskserve.demo", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    # CSP on HTML, nosniff and Referrer-Policy everywhere (static files and errors included).
    app.on_response_prepare.append(security_headers)
    app.on_response_prepare.append(close_connections_while_draining)
    setup_routes(app, routes)
    return app
