"""The one handle on the request path: everything a handler, a stage or a probe needs, behind one key.

The app factory builds a :class:`FillMaskService` from the settings, with one :class:`ServedModel`
per model the server serves (the first is the default, which ``POST /`` answers with); once the
models are loaded, its lifecycle context gives it the :class:`Loaded` parts (each model's engine,
batcher and admission, the one scheduler, the tokenizer's thread, the batch loop). Each served
model carries its tasks (tasks/), bound to its limits, and runs them: it plans a task's rows,
admits and queues them, and folds their answers back. A handler resolves the model its route names
and runs one of its tasks through ``request/run_task.py``'s ``run_task``; it gathers nothing itself. No
HTTP here: the handlers, the stages and the probes sit above it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from maskserve.config.model_configs import model_configs
from maskserve.config.settings import Settings
from maskserve.errors import NotFound
from maskserve.observability.metrics import Metrics
from maskserve.observability.peers import Peers
from maskserve.service.lifecycle import Lifecycle
from maskserve.service.model_control import ModelControl
from maskserve.service.served_model import ModelTable, ServedModel
from maskserve.serving.connection_guard import ConnectionGuard
from maskserve.serving.scheduler import Scheduler

# How a route's OpenAPI operation is written, from the settings' limits and the model's mask token.
Describe = Callable[[Settings, str], dict[str, Any]]


@dataclass(frozen=True)
class RouteOperation:
    """One route as the OpenAPI document lists it."""

    method: str  # lower case, as OpenAPI writes it
    path: str  # the path template; a static folder's with {filename}
    name: str  # the route's name, its operationId
    describe: Describe


@dataclass(frozen=True)
class RouteRoles:
    """What the route table says of its routes, for the stages that treat some apart and for the
    OpenAPI document.

    Handed down on the service, so no middleware or handler imports the module that wires the app.
    """

    # Route names that queue work for the model: admission may refuse these at the door, and only these.
    inference: frozenset[str] = frozenset()
    # Route names answered without an API key (probes, the demo page's GETs).
    public: frozenset[str] = frozenset()
    # The demo page's forms: they queue work for the model as well, but ask admission themselves to
    # show a refusal inline, so the circuit-breaking stage leaves them to it.
    forms: frozenset[str] = frozenset()
    # Route names that change which models serve: they need the control key, not the API key.
    control: frozenset[str] = frozenset()
    # Every route, in the table's order, with its documented operation.
    operations: tuple[RouteOperation, ...] = ()
    # The gRPC methods that queue work for the model (the metrics' route label for a call is its
    # method): admitted at the door as the inference routes are.
    calls: frozenset[str] = frozenset()

    @property
    def model_work(self) -> frozenset[str]:
        """Every route and gRPC method that queues work for the model: the requests the alert rules
        and the dashboard count (deploy/), and tests/unit/http/test_routes.py holds them to it."""
        return self.inference | self.forms | self.calls


@dataclass(frozen=True)
class Loaded:
    """What exists once every model is loaded, for as long as the app runs."""

    # The one inference thread's owner, which picks the model whose batch runs next.
    scheduler: Scheduler
    # The batch loop's task, so /livez can tell when it died.
    batch_loop: asyncio.Task[None]


class FillMaskService:
    """The settings, the shared state, and (once loaded) the model's side, in one handle."""

    def __init__(self, settings: Settings, middleware: tuple[str, ...] = ()) -> None:
        self.settings = settings
        # The active middleware chain's stage names, outermost first (for /info).
        self.middleware = middleware
        # Serving or draining: set by the runner on a stop signal, read by /readyz and every response.
        self.lifecycle = Lifecycle()
        self.metrics = Metrics()
        # Every model serving, by the name clients use; the first named at start is the default.
        self.table = ModelTable(settings, model_configs(settings), self.metrics)
        # Set by the route table (http/routes.py).
        self.routes = RouteRoles()
        # The model repository extension: loads, unloads, states and the memory budget; every
        # model, those named at start included, is loaded through it (http/app.py's inference context).
        self.control: ModelControl | None = None
        # With --workers: the other worker processes, so that /metrics reports the whole server.
        self.peers: Peers | None = None
        # None until the model is loaded (see http/app.py's inference_context).
        self.loaded: Loaded | None = None
        # Every client connection: timeouts, the connection cap, the answers slow readers hold.
        self.connections = ConnectionGuard(settings)
        self.metrics.watch_connections(self.connections)

    def _parts(self) -> Loaded:
        if self.loaded is None:
            # Handlers run only once the app has started, and it starts by loading the models.
            raise RuntimeError("the models are not loaded yet; this is a bug")
        return self.loaded

    @property
    def default(self) -> ServedModel:
        """The model the page and ``/info`` show first: the default model (``POST /``'s), or while it
        is unloaded the first model serving; a 404 when none is."""
        served = self.models.get(self.default_name) or next(iter(self.models.values()), None)
        return served if served is not None else self.served(self.default_name)

    def served(self, name: str | None = None) -> ServedModel:
        """The model named ``name`` (the default model for None); a 404 naming every served model
        otherwise, or saying why a known model is not loaded now."""
        name = self.default_name if name is None else name
        served = self.models.get(name)
        if served is None:
            if self.control is not None and self.control.knows(name):
                raise self.control.not_loaded(name)
            raise self.unknown(name)
        return served

    def unknown(self, name: str) -> NotFound:
        """The 404 for a name no model of this server has, naming the models it serves."""
        return self.table.unknown(name)

    @property
    def models(self) -> dict[str, ServedModel]:
        """Every model serving now, by name (the table's)."""
        return self.table.models

    @property
    def default_name(self) -> str:
        return self.table.default_name

    @property
    def model_listeners(self) -> list[Callable[[ServedModel], None]]:
        return self.table.listeners

    @property
    def scheduler(self) -> Scheduler:
        return self._parts().scheduler
