"""What the request path tells tracing, with no OpenTelemetry import.

A handler opens its steps and reports how its texts were served on the request's
:class:`RequestTrace`. With tracing off (the default) that is :data:`NO_TRACE`, whose methods do
nothing and cost nothing; the tracing stage (``middleware/request_tracing.py``, ``maskserve[otel]``) puts a
real one on the request's record (``RequestState.trace``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from maskserve.serving.work_queue import Answer


class RequestTrace(Protocol):
    """One request's trace, as the handlers see it."""

    @property
    def link(self) -> object:
        """What each of the request's texts carries to the batcher (``WorkItem.context``), so that
        the span of the forward pass that serves it links back to this request. The same object
        for every text of the request."""
        ...

    def step(self, name: str) -> AbstractContextManager[object]:
        """A child span around a step of the request (reading, parsing and tokenizing)."""
        ...

    def served(self, answers: Sequence[Answer], queued_ns: int) -> None:
        """Child spans for what happened to its texts: time in the queue from ``queued_ns`` (epoch
        nanoseconds) to their forward pass, and each forward pass that served them."""
        ...


class _NoTrace:
    link: object = None

    def step(self, name: str) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def served(self, answers: Sequence[Answer], queued_ns: int) -> None:
        return None


NO_TRACE: RequestTrace = _NoTrace()
