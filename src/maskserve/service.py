"""The one handle on the request path: everything a handler, a stage or a probe needs, behind one key.

The app factory builds a :class:`FillMaskService` from the settings, with one :class:`ServedModel`
per model the server serves (the first is the default, which ``POST /`` answers with); once the
models are loaded, its lifecycle context gives it the :class:`Loaded` parts (each model's engine,
batcher and admission, the one scheduler, the tokenizer's thread, the batch loop). A handler
resolves the model its route names, reads the request, asks the service for its queries and
answers, and shapes the response; it gathers nothing itself. No HTTP here: the handlers, the
stages and the probes sit above it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from .admission import Admission
from .batcher import Batcher
from .connections import ConnectionGuard
from .costs import Work
from .errors import NotFound
from .lifecycle import Lifecycle
from .metrics import Metrics, Peers
from .model_api import FillMaskModel, Query, text_answer_json
from .models_config import ModelConfig, model_configs
from .oip_schemas import InferRequestParser
from .scheduler import Scheduler
from .schemas import FillMaskRequest, RequestParser
from .score_schemas import ScoreRequest, ScoreRequestParser
from .settings import Settings
from .traces import RequestTrace
from .whole_words import FillWord, TextPlan, text_predictions
from .work_queue import Answer

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
    # Every route, in the table's order, with its documented operation.
    operations: tuple[RouteOperation, ...] = ()

    @property
    def model_work(self) -> frozenset[str]:
        """Every route that queues work for the model: the requests the alert rules and the
        dashboard count (deploy/), and tests/test_routes.py holds them to it."""
        return self.inference | self.forms


@dataclass(frozen=True)
class ModelParts:
    """One model once loaded: its engine, its own queue and batches, its own admission."""

    model: FillMaskModel
    batcher: Batcher
    admission: Admission


@dataclass(frozen=True)
class Loaded:
    """What exists once every model is loaded, for as long as the app runs."""

    # By name, the default model first.
    models: dict[str, ModelParts]
    # The one inference thread's owner, which picks the model whose batch runs next.
    scheduler: Scheduler
    # One thread that tokenizes long texts, so that it takes at most one core from the models.
    tokenizer: Executor
    # The batch loop's task, so /livez can tell when it died.
    batch_loop: asyncio.Task[None]


class ServedModel:
    """One model the server serves: the name clients use, its settings and the parsers bound to its
    limits, known before it loads; its :class:`ModelParts` once loaded."""

    def __init__(self, config: ModelConfig) -> None:
        # What to load and how, as the settings named it (the app loads every model from these).
        self.config = config
        self.name = config.name
        self.settings = config.settings
        self.parser = RequestParser(config.settings)
        # The Open Inference Protocol's infer request parser, with the same limits.
        self.oip_parser = InferRequestParser(config.settings)
        # POST /score's parser: texts into masked copies, with the same limits and its own.
        self.score_parser = ScoreRequestParser(config.settings)
        self.parts: ModelParts | None = None

    @property
    def loaded(self) -> ModelParts:
        if self.parts is None:
            # Handlers run only once the app has started, and it starts by loading every model.
            raise RuntimeError(f"model {self.name!r} is not loaded yet; this is a bug")
        return self.parts


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
        # Set by the route table (routes.py).
        self.routes = RouteRoles()
        # With --workers: the other worker processes, so that /metrics reports the whole server.
        self.peers: Peers | None = None
        # None until the model is loaded (see app.inference_context).
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
        """The default model: the first named, which ``POST /`` and ``POST /score`` serve."""
        return next(iter(self.models.values()))

    def served(self, name: str | None = None) -> ServedModel:
        """The model named ``name`` (the default for None); a 404 naming every served model otherwise."""
        if name is None:
            return self.default
        served = self.models.get(name)
        if served is None:
            names = ", ".join(repr(known) for known in self.models)
            raise NotFound(f"no model named {name!r} here; this server serves {names}")
        return served

    # The default model's parts, for callers that serve it alone.

    @property
    def model(self) -> FillMaskModel:
        return self.default.loaded.model

    @property
    def batcher(self) -> Batcher:
        return self.default.loaded.batcher

    @property
    def admission(self) -> Admission:
        return self.default.loaded.admission

    @property
    def scheduler(self) -> Scheduler:
        return self._parts().scheduler

    def at_door(self, deadline: float, served: ServedModel | None = None) -> None:
        """Admission at the door, before the body is read: every route that queues work asks this."""
        (served or self.default).loaded.admission.at_door(deadline - asyncio.get_running_loop().time())

    async def plans(self, parsed: FillMaskRequest, served: ServedModel | None = None) -> list[TextPlan]:
        """Tokenize and check a parsed request's texts and targets for ``served`` (the default
        model) (a 4xx names the first problem), off the event loop unless they are short."""
        served = served or self.default
        model = served.loaded.model
        chars = sum(len(text) for text in (*parsed.texts, *(parsed.targets or ())))
        if chars <= INLINE_TOKENIZE_CHARS:
            return served.parser.plans(parsed, model)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._parts().tokenizer, served.parser.plans, parsed, model)

    async def text_answers(
        self, plans: Sequence[TextPlan], answers: Sequence[Answer], served: ServedModel | None = None
    ) -> list[Answer]:
        """One answer per text from the answers to its plan's queries, in order: its own, or its
        own and its whole words combined (decoded off the event loop unless they are few)."""
        if not any(plan.has_words for plan in plans):
            return list(answers)
        model = (served or self.default).loaded.model
        decoded = sum(plan.word_predictions * plan.query.n_tokens for plan in plans)
        if decoded <= INLINE_DECODE_TOKENS:
            return combined_answers(plans, answers, model.fill_word)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._parts().tokenizer, combined_answers, plans, answers, model.fill_word)

    async def score_copies(
        self, parsed: ScoreRequest, served: ServedModel | None = None, element: str = "inputs[{index}]"
    ) -> list[list[Query]]:
        """Tokenize a parsed ``/score`` request's texts into ``served``'s (the default model's) masked
        copies (a 4xx names the first problem, a text of several by ``element``), off the event loop
        unless they are short: a text's copies grow with the square of its length."""
        served = served or self.default
        model = served.loaded.model
        if sum(len(text) for text in parsed.texts) <= INLINE_TOKENIZE_CHARS:
            return served.score_parser.copies(parsed, model, element)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._parts().tokenizer, served.score_parser.copies, parsed, model, element)

    async def answer(
        self, queries: Sequence[Query], deadline: float, trace: RequestTrace, served: ServedModel | None = None
    ) -> list[Answer]:
        """Admit a request on its whole cost, queue its texts and wait for their answers, traced."""
        served = served or self.default
        parts = served.loaded
        time_left = deadline - asyncio.get_running_loop().time()
        parts.admission.admit(Work.of(queries), time_left, served.settings.request_timeout)
        queued_ns = time.time_ns()
        answers = await parts.batcher.answer(queries, deadline, trace.link)
        trace.served(answers, queued_ns)
        return answers


def combined_answers(plans: Sequence[TextPlan], answers: Sequence[Answer], fill: FillWord) -> list[Answer]:
    """Per text, its queries' answers as one: its predictions with the whole words scored and
    decoded in, as JSON, served as its slowest query was."""
    per_text: list[Answer] = []
    start = 0
    for plan in plans:
        own = answers[start : start + len(plan.queries)]
        start += len(plan.queries)
        if not plan.has_words:
            per_text.append(own[0])
            continue
        predictions = text_predictions(plan, [a.predictions for a in own], fill)
        per_text.append(
            dataclasses.replace(
                own[0],
                predictions=predictions,
                json=text_answer_json(predictions),
                queued_s=max(a.queued_s for a in own),
                inference_s=max(a.inference_s for a in own),
                batch_size=max(a.batch_size for a in own),
            )
        )
    if start != len(answers):
        raise RuntimeError(f"{len(answers)} answers for {start} queries; this is a bug")
    return per_text
