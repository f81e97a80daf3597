"""The one controllable model, for driving the batcher and the server into corners.

:class:`ControlledModel` wraps a real engine (or :class:`EchoModel`, a pure-Python one that takes
the time a real one would when told to) and records every batch the inference thread ran; it can
hold a forward pass until released, raise for chosen texts or for every one, and fail to tokenize.
:func:`holding` is the set-up of every overload test: one request held in its forward pass, others
queued behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from maskserve.model_api import FillMaskModel, Prediction, Progress, Query, TextPredictions, Words
from maskserve.request.keys import SERVICE_KEY
from maskserve.service.served_model import ModelParts
from maskserve.serving.batcher import Batcher


@dataclass(frozen=True)
class Costs:
    """Seconds a model spends, as a real one would: a pass, per padded token, per decoded token."""

    per_pass: float = 0.0
    per_padded_token: float = 0.0
    per_prediction_token: float = 0.0


class EchoModel:
    """A pure-Python model: its one prediction names the text's token ids, so answers are checkable.

    With ``costs``, it takes the time a real model would, in the same two phases: the forward
    pass, then each text's post-processing (skipped for a text nobody waits for).
    """

    name = "echo"
    mask_token = "[MASK]"
    mask_token_id = 4
    max_tokens = 512
    specials_around = (1, 1)

    def __init__(self, costs: Costs = Costs(), word: str = "echo") -> None:
        self.costs = costs
        # Every prediction's token_str and, when not the default, its sequence too.
        self.word = word

    def encode(self, text: str) -> tuple[int, ...]:
        # One token per word, plus [CLS]/[SEP]; "[MASK]" is token 4 as in BERT.
        return (101, *(4 if word == "[MASK]" else 1000 + len(word) for word in text.split()), 102)

    def encode_words(self, text: str) -> Words:
        ids = self.encode(text)
        return ids, (None, *range(len(ids) - 2), None)

    def count_masks(self, input_ids: Sequence[int]) -> int:
        return sum(1 for i in input_ids if i == 4)

    def resolve_targets(self, targets: Sequence[str]) -> tuple[int, ...]:
        return tuple(dict.fromkeys(word[0] for word in self.target_tokens(targets) if word))

    def target_tokens(self, targets: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        # As encode: one token per word, so "new york" is a whole word of two.
        return tuple(tuple(1000 + len(word) for word in target.split()) for target in targets)

    def fill_word(self, input_ids: Sequence[int], position: int, word: Sequence[int]) -> tuple[str, str]:
        filled = (*input_ids[:position], *word, *input_ids[position + 1 :])
        return " ".join(str(token) for token in word), str(filled) if self.word == "echo" else self.word

    def prediction_bytes(self, input_ids: Sequence[int]) -> int:
        # The sequence is str(input_ids): at most 8 characters a token, plus the keys and score.
        return 128 + 8 * len(input_ids)

    def predict(self, queries: Sequence[Query], progress: Progress | None = None) -> list[TextPredictions]:
        costs = self.costs
        padded = len(queries) * max((q.n_tokens for q in queries), default=0)
        time.sleep(costs.per_pass + costs.per_padded_token * padded)
        if progress is not None:
            progress.forward_done()
        answers: list[TextPredictions] = []
        for i, q in enumerate(queries):
            if progress is not None and not progress.wanted(i):
                answers.append([])
                continue
            time.sleep(costs.per_prediction_token * q.predictions * q.n_tokens)
            sequence = str(q.input_ids) if self.word == "echo" else self.word
            # A target's id, so that a whole word's copies are answered for their own token.
            token = q.target_ids[0] if q.target_ids else sum(q.input_ids)
            prediction = Prediction(score=1.0, token=token, token_str=self.word, sequence=sequence)
            masks = self.count_masks(q.input_ids) if q.answer_positions is None else len(q.answer_positions)
            answers.append([[prediction] for _ in range(masks)])
        return answers


class ControlledModel:
    """Wraps a model; records batches, can gate forward passes and raise for chosen inputs."""

    def __init__(self, inner: FillMaskModel | None = None) -> None:
        self.inner: FillMaskModel = inner if inner is not None else EchoModel()
        self.name = self.inner.name
        self.mask_token = self.inner.mask_token
        self.mask_token_id = self.inner.mask_token_id
        self.max_tokens = self.inner.max_tokens
        self.specials_around = self.inner.specials_around
        self.batches: list[list[tuple[int, ...]]] = []
        self.gate = threading.Event()
        self.gate.set()  # open: passes run freely until a test closes it
        self.entered = threading.Event()  # set when a pass starts (and waits at the gate)
        self.poisoned: set[tuple[int, ...]] = set()
        self.fail_all = False
        # Raised by encode: an unexpected failure before anything is queued.
        self.encode_error: Exception | None = None
        self.on_predict: Callable[[Sequence[Query]], None] | None = None

    def encode(self, text: str) -> tuple[int, ...]:
        if self.encode_error is not None:
            raise self.encode_error
        return self.inner.encode(text)

    def encode_words(self, text: str) -> Words:
        if self.encode_error is not None:
            raise self.encode_error
        return self.inner.encode_words(text)

    def count_masks(self, input_ids: Sequence[int]) -> int:
        return self.inner.count_masks(input_ids)

    def resolve_targets(self, targets: Sequence[str]) -> tuple[int, ...]:
        return self.inner.resolve_targets(targets)

    def target_tokens(self, targets: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        return self.inner.target_tokens(targets)

    def fill_word(self, input_ids: Sequence[int], position: int, word: Sequence[int]) -> tuple[str, str]:
        return self.inner.fill_word(input_ids, position, word)

    def prediction_bytes(self, input_ids: Sequence[int]) -> int:
        return self.inner.prediction_bytes(input_ids)

    def hold(self) -> None:
        """Make the next forward passes wait until :meth:`release`."""
        self.entered.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def predict(self, queries: Sequence[Query], progress: Progress | None = None) -> list[TextPredictions]:
        self.batches.append([q.input_ids for q in queries])
        self.entered.set()
        if not self.gate.wait(timeout=30):
            raise RuntimeError("test gate never released")
        if self.fail_all:
            raise RuntimeError("injected fault for every input")
        if any(q.input_ids in self.poisoned for q in queries):
            raise RuntimeError("injected fault: poisoned input in this batch")
        return self.inner.predict(queries, progress)

    def batch_sizes(self) -> list[int]:
        return [len(b) for b in self.batches]


def default_parts(client: TestClient[web.Request, web.Application]) -> ModelParts:
    """The default model's engine, batcher and admission in the app under test."""
    return client.app[SERVICE_KEY].default.loaded


async def wait_until_entered(model: ControlledModel) -> None:
    """Until the inference thread is inside ``predict`` (held at the gate, if the model holds)."""
    assert await asyncio.to_thread(model.entered.wait, 5), "the forward pass never started"


async def wait_for_depth(batcher: Batcher, depth: int) -> None:
    """Until ``depth`` texts wait in the batcher's queue; fails, rather than hangs, if they never do."""
    for _ in range(500):
        if batcher.depth >= depth:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the queue never reached {depth} texts (it holds {batcher.depth})")


async def leave_once_queued(
    client: TestClient[web.Request, web.Application], path: str, rows: int, **request: Any
) -> None:
    """POST ``request`` to ``path`` from a client of its own, wait until its ``rows`` wait in the
    default model's queue, then leave: the connection closes before any answer."""
    async with aiohttp.ClientSession() as other:
        leaver = asyncio.create_task(other.post(client.make_url(path), **request))
        await wait_for_depth(default_parts(client).batcher, rows)
        leaver.cancel()
        await asyncio.gather(leaver, return_exceptions=True)


@dataclass
class Held:
    """A forward pass held at the model's gate, and the requests queued behind it."""

    busy: asyncio.Task[ClientResponse]
    queued: list[asyncio.Task[ClientResponse]]

    async def statuses(self) -> list[int]:
        """Every one's status, the held request's first (once the model is released)."""
        return [response.status for response in await asyncio.gather(self.busy, *self.queued)]


@contextlib.asynccontextmanager
async def holding(
    client: TestClient[web.Request, web.Application],
    model: ControlledModel,
    queued: Sequence[str] = (),
    *,
    first: str = "a [MASK]",
    first_headers: Mapping[str, str] | None = None,
) -> AsyncIterator[Held]:
    """The set-up of every overload test: ``first`` runs and is held inside its forward pass, then
    each of ``queued`` is sent and waits in the queue behind it. The model is released on leaving,
    whatever happened inside."""
    model.hold()
    try:
        busy = asyncio.create_task(client.post("/", data=first, headers=first_headers))
        await wait_until_entered(model)
        waiting = [asyncio.create_task(client.post("/", data=text)) for text in queued]
        await wait_for_depth(default_parts(client).batcher, len(waiting))
        yield Held(busy, waiting)
    finally:
        model.release()
