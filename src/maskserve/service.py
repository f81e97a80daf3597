"""The one handle on the request path: everything a handler, a stage or a probe needs, behind one key.

The app factory builds a :class:`FillMaskService` from the settings; once the model is loaded, its
lifecycle context gives it the :class:`Loaded` parts (model, batcher, admission, the tokenizer's
thread, the batch loop). A handler reads the request, asks the service for its queries and
answers, and shapes the response; it gathers nothing itself. No HTTP here: the handlers, the
stages and the probes sit above it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from .admission import Admission
from .batcher import Batcher
from .connections import ConnectionGuard
from .costs import Work
from .lifecycle import Lifecycle
from .metrics import Metrics, Peers
from .model_api import FillMaskModel, Query
from .oip_schemas import InferRequestParser
from .schemas import FillMaskRequest, RequestParser
from .score_schemas import ScoreRequest, ScoreRequestParser
from .settings import Settings
from .traces import RequestTrace
from .work_queue import Answer

# Texts up to this many characters in all are tokenized on the event loop: a hop to the tokenizer
# thread costs more than they do. Longer ones go to that thread, where the tokenizer releases the
# interpreter lock, so no request's texts can hold the event loop (and /livez) for long.
INLINE_TOKENIZE_CHARS = 512


@dataclass(frozen=True)
class RouteRoles:
    """What the route table says of its routes, for the stages that treat some apart.

    Handed down on the service, so no middleware imports the module that wires the app.
    """

    # Route names that queue work for the model: admission may refuse these at the door, and only these.
    inference: frozenset[str] = frozenset()
    # Route names answered without an API key (probes, the demo page's GETs).
    public: frozenset[str] = frozenset()
    # The demo page's forms: they queue work for the model as well, but ask admission themselves to
    # show a refusal inline, so the circuit-breaking stage leaves them to it.
    forms: frozenset[str] = frozenset()

    @property
    def model_work(self) -> frozenset[str]:
        """Every route that queues work for the model: the requests the alert rules and the
        dashboard count (deploy/), and tests/test_routes.py holds them to it."""
        return self.inference | self.forms


@dataclass(frozen=True)
class Loaded:
    """What exists once the model is loaded, for as long as the app runs."""

    model: FillMaskModel
    batcher: Batcher
    admission: Admission
    # One thread that tokenizes long texts, so that it takes at most one core from the model.
    tokenizer: Executor
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
        self.parser = RequestParser(settings)
        # The Open Inference Protocol's infer request parser, with the same limits.
        self.oip_parser = InferRequestParser(settings)
        # POST /score's parser: texts into masked copies, with the same limits and its own.
        self.score_parser = ScoreRequestParser(settings)
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
            # Handlers run only once the app has started, and it starts by loading the model.
            raise RuntimeError("the model is not loaded yet; this is a bug")
        return self.loaded

    @property
    def model(self) -> FillMaskModel:
        return self._parts().model

    @property
    def batcher(self) -> Batcher:
        return self._parts().batcher

    @property
    def admission(self) -> Admission:
        return self._parts().admission

    def at_door(self, deadline: float) -> None:
        """Admission at the door, before the body is read: every route that queues work asks this."""
        self.admission.at_door(deadline - asyncio.get_running_loop().time())

    async def queries(self, parsed: FillMaskRequest) -> list[Query]:
        """Tokenize and check a parsed request's texts (a 4xx names the first problem), off the
        event loop unless they are short."""
        parts = self._parts()
        if sum(len(text) for text in parsed.texts) <= INLINE_TOKENIZE_CHARS:
            return self.parser.queries(parsed, parts.model)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(parts.tokenizer, self.parser.queries, parsed, parts.model)

    async def score_copies(self, parsed: ScoreRequest, element: str = "inputs[{index}]") -> list[list[Query]]:
        """Tokenize a parsed ``/score`` request's texts into their masked copies (a 4xx names the
        first problem, a text of several by ``element``), off the event loop unless they are short:
        a text's copies grow with the square of its length."""
        parts = self._parts()
        if sum(len(text) for text in parsed.texts) <= INLINE_TOKENIZE_CHARS:
            return self.score_parser.copies(parsed, parts.model, element)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(parts.tokenizer, self.score_parser.copies, parsed, parts.model, element)

    async def answer(self, queries: Sequence[Query], deadline: float, trace: RequestTrace) -> list[Answer]:
        """Admit a request on its whole cost, queue its texts and wait for their answers, traced."""
        parts = self._parts()
        time_left = deadline - asyncio.get_running_loop().time()
        parts.admission.admit(Work.of(queries), time_left, self.settings.request_timeout)
        queued_ns = time.time_ns()
        answers = await parts.batcher.answer(queries, deadline, trace.link)
        trace.served(answers, queued_ns)
        return answers
