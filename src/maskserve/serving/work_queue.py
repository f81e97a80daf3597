"""The queue's records and one model's queue of them.

A :class:`WorkItem` is a unit of work for one model: the rows one forward pass reads for it (today a
fill-mask text, one row), with its own reply future and clock readings. A :class:`WorkQueue` holds
one model's items oldest first and keeps their total :class:`~maskserve.serving.costs.Work` as they come and
go. Neither decides anything: admission decides what comes in, the batcher's scheduler what runs
next, so a second kind of rows or a second model's queue changes only those.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from maskserve.model_api import Query, TextPredictions
from maskserve.serving.costs import Work


@dataclass(frozen=True)
class TextAnswer:
    """What the inference thread hands back for one text: its predictions, and them as JSON (empty
    for an answer the server reads itself, see ``Query.read_by_server``)."""

    predictions: TextPredictions
    json: bytes


@dataclass(frozen=True)
class Answer:
    """One text's predictions and how it was served, for the timing headers, metrics and traces."""

    predictions: TextPredictions
    queued_s: float
    inference_s: float
    batch_size: int
    # When its forward pass began (epoch nanoseconds, for trace spans) and which pass it was.
    started_ns: int = 0
    batch_number: int = 0
    # The predictions as the JSON the pipeline's shape gives one text (model_api.text_answer_json),
    # made on the inference thread: the event loop only joins the texts of a request.
    json: bytes = b""


@dataclass(frozen=True)
class Timing:
    """How a request was served, told by its slowest text: each figure the largest of its texts'."""

    queued_s: float
    inference_s: float
    batch_size: int


def slowest(answers: Sequence[Answer]) -> Timing:
    """The timing of a request whose texts got ``answers``: the one rule the timing headers, a
    text made of several queries and the demo page all follow."""
    return Timing(
        queued_s=max(a.queued_s for a in answers),
        inference_s=max(a.inference_s for a in answers),
        batch_size=max(a.batch_size for a in answers),
    )


@dataclass(eq=False)
class WorkItem:
    """One text waiting for the model, carrying its own reply future and clock readings."""

    query: Query
    future: asyncio.Future[Answer]
    enqueued_at: float
    deadline: float
    # Whatever the caller attached (the request's trace span), handed back in the BatchReport so a
    # listener can link the forward pass to every request it served. Opaque here; one request's
    # texts carry the same object.
    context: object = None

    @property
    def n_tokens(self) -> int:
        return self.query.n_tokens

    @functools.cached_property
    def work(self) -> Work:
        return Work.of((self.query,))

    def wanted(self) -> bool:
        """Whether anyone still waits for this text; safe to ask from the inference thread.

        A future is only resolved on the event loop, but reading whether it is done is one
        attribute read, and once done it stays done. The deadline is on the event loop's clock,
        which is ``time.monotonic()`` for asyncio's loops, so the thread can read it too.
        """
        return not self.future.done() and time.monotonic() < self.deadline


@dataclass
class DropCounts:
    """Items removed before inference: deadline passed, or the client stopped waiting."""

    expired: int = 0
    abandoned: int = 0


class WorkQueue:
    """One model's waiting items, oldest first, and the work they add up to."""

    def __init__(self) -> None:
        self._items: deque[WorkItem] = deque()
        # Everything queued, kept as items come and go: the predicted wait reads it per request.
        self.work = Work()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[WorkItem]:
        return iter(self._items)

    @property
    def oldest(self) -> WorkItem:
        return self._items[0]

    def append(self, item: WorkItem) -> None:
        self._items.append(item)
        self.work += item.work

    def pop(self) -> WorkItem:
        """Remove and return the oldest item."""
        item = self._items.popleft()
        self.work -= item.work
        return item

    def discard_done(self) -> list[WorkItem]:
        """Remove every item whose future is done, wherever it waits; returns them (O(queue))."""
        live: deque[WorkItem] = deque()
        done: list[WorkItem] = []
        for item in self._items:
            if item.future.done():
                self.work -= item.work
                done.append(item)
            else:
                live.append(item)
        self._items = live
        return done

    def window(self, size: int) -> list[WorkItem]:
        """Up to ``size`` items still wanted, oldest first."""
        window: list[WorkItem] = []
        for item in self._items:
            if len(window) >= size:
                break
            if not item.future.done():
                window.append(item)
        return window

    def remove(self, batch: Sequence[WorkItem]) -> None:
        """Take ``batch`` (items of this queue) out, wherever they wait."""
        taken = {id(item) for item in batch}
        self._items = deque(item for item in self._items if id(item) not in taken)
        self.work -= Work.of([item.query for item in batch])
