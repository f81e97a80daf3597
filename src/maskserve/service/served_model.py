"""One served model and the table of every model a server serves now.

A :class:`ServedModel` is what a route resolves: the name clients use, its settings, the parsers
and tasks bound to its limits, and once loaded its :class:`ModelParts` (engine, lane, admission).
The :class:`ModelTable` holds the models serving now, by name, with what every model's start and
end touch (the metrics, the listeners that observe each new model). The model control changes the
table; the request path reads it. No HTTP, no torch, and nothing of the control or the registry
above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from maskserve.config.model_settings import ModelConfig
from maskserve.config.settings import Settings
from maskserve.errors import ModelUnavailable, NotFound
from maskserve.model_api import FillMaskModel, Query
from maskserve.observability.metrics import Metrics
from maskserve.observability.request_trace import RequestTrace
from maskserve.serving.admission import Admission
from maskserve.serving.batcher import Batcher
from maskserve.serving.costs import Work
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask import FillMask
from maskserve.tasks.fill_mask_request import RequestParser
from maskserve.tasks.score import Score
from maskserve.tasks.score_request import ScoreRequestParser
from maskserve.tasks.task import AnswerT, PlanT, RequestT, Task

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


@dataclass(frozen=True)
class ModelParts:
    """One model once loaded: its engine, its own queue and batches, its own admission."""

    model: FillMaskModel
    batcher: Batcher
    admission: Admission
    # One thread, every model's, that tokenizes long texts (so that it takes at most one core from
    # the models): long plans and folds run there.
    tokenizer: Executor


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
        # Set once an unload (or a reload's swap) has released this model: a request that resolved
        # it just before can no longer run here, and is told to retry (503) rather than failing.
        self.released = False

    @property
    def loaded(self) -> ModelParts:
        if self.parts is None:
            # Handlers reach a model only once it is in the table, and it is put there once loaded.
            raise RuntimeError(f"model {self.name!r} is not loaded yet; this is a bug")
        return self.parts

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """One request of this model, from its parse to its answer (an unload waits for it)."""
        if self.released:
            raise ModelUnavailable(f"model {self.name!r} was unloaded or reloaded before this request ran; retry it")
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

    async def answer(
        self, queries: Sequence[Query], deadline: float, trace: RequestTrace, *, cost: Work | None = None
    ) -> list[Answer]:
        """Admit a request on its whole cost (``cost``, or its rows'), queue its rows and wait for
        their answers, traced. ``Work()`` admits nothing more: a later round of a request admitted
        on the cost of all its rounds."""
        parts = self.loaded
        time_left = deadline - asyncio.get_running_loop().time()
        work = Work.of(queries) if cost is None else cost
        if work.texts:
            parts.admission.admit(work, time_left, self.settings.request_timeout)
        queued_ns = time.time_ns()
        answers = await parts.batcher.answer(queries, deadline, trace.link)
        trace.served(answers, queued_ns)
        return answers


class ModelTable:
    """The models serving now, by the name clients use, and what each model's start and end touch."""

    def __init__(self, settings: Settings, configs: Sequence[ModelConfig], metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        # Every model serving, by name. Until the start-up loads end, the models named at start
        # are here unloaded; no route runs before then.
        self.models: dict[str, ServedModel] = {config.name: ServedModel(config) for config in configs}
        # The first named at start: the model POST / and POST /score serve, even once it is unloaded
        # (they then answer 404, or load it on demand) rather than another model in its place.
        self.default_name = next(iter(self.models))
        # Called with each model once it is started, at start-up or loaded while serving (the
        # tracing stage observes its batches).
        self.listeners: list[Callable[[ServedModel], None]] = []

    def unknown(self, name: str) -> NotFound:
        """The 404 for a name no model of this server has, naming the models it serves."""
        names = ", ".join(repr(known) for known in self.models) or "none now"
        return NotFound(f"no model named {name!r} here; this server serves {names}")
