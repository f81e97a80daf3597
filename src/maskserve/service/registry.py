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
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maskserve.config.model_configs import ModelConfig, model_configs
from maskserve.config.settings import Settings
from maskserve.errors import ModelNotLoaded, NotFound
from maskserve.model_api import FillMaskModel, Query
from maskserve.observability.metrics import Metrics, Peers
from maskserve.observability.request_trace import RequestTrace
from maskserve.service.lifecycle import Lifecycle
from maskserve.serving.admission import Admission
from maskserve.serving.batcher import Batcher
from maskserve.serving.connection_guard import ConnectionGuard
from maskserve.serving.costs import Work
from maskserve.serving.scheduler import Scheduler
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask import FillMask
from maskserve.tasks.fill_mask_request import RequestParser
from maskserve.tasks.score import Score
from maskserve.tasks.score_request import ScoreRequestParser
from maskserve.tasks.task import AnswerT, PlanT, RequestT, Task

if TYPE_CHECKING:
    from maskserve.service.model_control import ModelControl

# The one version of each model this server serves: model metadata and the repository index list
# it, and a request may name it.
MODEL_VERSION = "1"

# Texts up to this many characters in all are tokenized on the event loop: a hop to the tokenizer
# thread costs more than they do. Longer ones go to that thread, where the tokenizer releases the
# interpreter lock, so no request's texts can hold the event loop (and /livez) for long.
INLINE_TOKENIZE_CHARS = 512
# Whole words decoded into answers, times their texts' tokens, up to which they are decoded on the
# event loop; more go to the tokenizer's thread, so no request's answer can hold the loop for long.
INLINE_DECODE_TOKENS = 4096


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
class ModelParts:
    """One model once loaded: its engine, its own queue and batches, its own admission."""

    model: FillMaskModel
    batcher: Batcher
    admission: Admission
    # One thread, every model's, that tokenizes long texts (so that it takes at most one core from
    # the models): long plans and folds run there.
    tokenizer: Executor


@dataclass(frozen=True)
class Loaded:
    """What exists once every model is loaded, for as long as the app runs."""

    # The one inference thread's owner, which picks the model whose batch runs next.
    scheduler: Scheduler
    # The batch loop's task, so /livez can tell when it died.
    batch_loop: asyncio.Task[None]


class ServedModel:
    """One model the server serves: the name clients use, its settings, the parsers and tasks bound
    to its limits, known before it loads; its :class:`ModelParts` once loaded, with which it plans,
    admits, queues and folds its tasks' work."""

    def __init__(self, config: ModelConfig) -> None:
        # What to load and how, as the settings named it (the app loads every model from these).
        self.config = config
        self.name = config.name
        self.settings = config.settings
        self.parser = RequestParser(config.settings)
        # POST /score's parser: texts into masked copies, with the same limits and its own.
        self.score_parser = ScoreRequestParser(config.settings)
        # Its tasks, bound to its limits: every surface runs these (tasks/).
        self.fill_mask = FillMask(self.parser)
        self.score = Score(self.score_parser)
        self.parts: ModelParts | None = None
        # Requests of this model between their parse and their answer, and when the last began:
        # an unload waits for them (they were accepted), and eviction picks the least recently used.
        self.active = 0
        self.last_used = time.monotonic()
        self.quiet = asyncio.Event()
        self.quiet.set()
        # Set once an unload has released this model: a request that resolved it just before can
        # no longer run, and is told so (404) rather than failing.
        self.released = False

    @property
    def loaded(self) -> ModelParts:
        if self.parts is None:
            # Handlers run only once the app has started, and it starts by loading every model.
            raise RuntimeError(f"model {self.name!r} is not loaded yet; this is a bug")
        return self.parts

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """One request of this model, from its parse to its answer (an unload waits for it)."""
        if self.released:
            raise ModelNotLoaded(f"model {self.name!r} was unloaded before this request ran")
        self.active += 1
        self.last_used = time.monotonic()
        self.quiet.clear()
        try:
            yield
        finally:
            self.active -= 1
            if not self.active:
                self.quiet.set()

    def at_door(self, deadline: float) -> None:
        """Admission at the door, before the body is read: every route that queues work asks this."""
        self.loaded.admission.at_door(deadline - asyncio.get_running_loop().time())

    async def plan(self, task: Task[RequestT, PlanT, Any], request: RequestT) -> PlanT:
        """``task``'s rows for ``request`` on this model, checked (a 4xx names the first problem):
        tokenized on the event loop when short, on the tokenizer's thread otherwise."""
        model = self.loaded.model
        if task.tokenizes(request) <= INLINE_TOKENIZE_CHARS:
            return task.plan(request, model)
        return await asyncio.get_running_loop().run_in_executor(self.loaded.tokenizer, task.plan, request, model)

    async def fold(self, task: Task[Any, PlanT, AnswerT], plan: PlanT, answers: Sequence[Answer]) -> AnswerT:
        """``task``'s answer from its rows' answers: on the event loop when it decodes little, on
        the tokenizer's thread otherwise."""
        model = self.loaded.model
        if task.decodes(plan) <= INLINE_DECODE_TOKENS:
            return task.fold(plan, answers, model)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.loaded.tokenizer, task.fold, plan, answers, model)

    async def answer(self, queries: Sequence[Query], deadline: float, trace: RequestTrace) -> list[Answer]:
        """Admit a request on its whole cost, queue its rows and wait for their answers, traced."""
        parts = self.loaded
        time_left = deadline - asyncio.get_running_loop().time()
        parts.admission.admit(Work.of(queries), time_left, self.settings.request_timeout)
        queued_ns = time.time_ns()
        answers = await parts.batcher.answer(queries, deadline, trace.link)
        trace.served(answers, queued_ns)
        return answers


class FillMaskService:
    """The settings, the shared state, and (once loaded) the model's side, in one handle."""

    def __init__(self, settings: Settings, middleware: tuple[str, ...] = ()) -> None:
        self.settings = settings
        # The active middleware chain's stage names, outermost first (for /info).
        self.middleware = middleware
        # Serving or draining: set by the runner on a stop signal, read by /readyz and every response.
        self.lifecycle = Lifecycle()
        self.metrics = Metrics()
        # Every model served, by the name clients use; the first is the default.
        self.models: dict[str, ServedModel] = {config.name: ServedModel(config) for config in model_configs(settings)}
        # The first named at start: the model POST / and POST /score serve, even once it is unloaded
        # (they then answer 404, or load it on demand) rather than another model in its place.
        self.default_name = next(iter(self.models))
        # Set by the route table (http/routes.py).
        self.routes = RouteRoles()
        # Called with each model once it is started, at start-up or loaded while serving (the
        # tracing stage observes its batches).
        self.model_listeners: list[Callable[[ServedModel], None]] = []
        # The model repository extension: loads, unloads, states and the memory budget (set with
        # the models, in http/app.py's inference context).
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
        names = ", ".join(repr(known) for known in self.models) or "none now"
        return NotFound(f"no model named {name!r} here; this server serves {names}")

    @property
    def scheduler(self) -> Scheduler:
        return self._parts().scheduler
