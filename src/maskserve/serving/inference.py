"""The inference thread's side of a batch: run it, isolate failures, post-process what is wanted.

Everything here runs on the one inference thread, never on the event loop: :func:`infer` computes a
batch of :class:`~maskserve.serving.work_queue.WorkItem` records and hands back an :class:`Outcome`, which
the batch loop turns into answers on the event loop. It asks each item whether anyone still waits
between texts and between masks, so a request answered 504, or whose client left, costs nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from maskserve.model_api import FillMaskModel, Progress, Query, TextPredictions, text_answer_json
from maskserve.serving.costs import BatchReport, Work
from maskserve.serving.packing import padded_cost
from maskserve.serving.work_queue import TextAnswer, WorkItem

T = TypeVar("T")


class OnePass(Generic[T]):
    """One call for the inference thread that lets go of what it calls as soon as it has run.

    The executor's thread holds its work item (this object) until after the call's result is set,
    and by then the event loop may already have the answer, finished an unload and collected: a
    call that kept its batcher would keep the unloaded model's engine alive a moment longer than
    the unload's hand-back of memory. So the call drops its own references before it returns:
    once a pass's answer reaches the loop, nothing on the inference thread holds its engine, and an
    unload never needs to wait for that thread."""

    __slots__ = ("_call",)

    def __init__(self, call: Callable[[], T]) -> None:
        self._call: Callable[[], T] | None = call

    def __call__(self) -> T:
        call, self._call = self._call, None
        if call is None:
            raise RuntimeError("a pass runs once; this is a bug")
        return call()


def predict_isolating(
    model: FillMaskModel, queries: Sequence[Query], progress: Progress | None = None
) -> list[TextPredictions | Exception]:
    """Run one batch; if it raises, split it in halves until the failing inputs stand alone.

    Runs on the inference thread. One poisoned input (or an out-of-memory batch) then costs its
    neighbours a few extra forward passes instead of their answers.
    """
    try:
        answers = model.predict(queries, progress)
    except Exception as exc:  # noqa: BLE001 - any model failure is isolated the same way
        if len(queries) == 1:
            return [exc]
        middle = len(queries) // 2
        later = None if progress is None else _Shifted(progress, middle)
        return predict_isolating(model, queries[:middle], progress) + predict_isolating(model, queries[middle:], later)
    if len(answers) != len(queries):
        raise RuntimeError(f"model returned {len(answers)} answers for {len(queries)} queries; this is a bug")
    return list(answers)


class _Shifted:
    """A batch's progress as its second half sees it (after an isolating split)."""

    def __init__(self, progress: Progress, offset: int) -> None:
        self.progress, self.offset = progress, offset

    def forward_done(self) -> None:
        self.progress.forward_done()

    def wanted(self, index: int) -> bool:
        return self.progress.wanted(index + self.offset)


class BatchProgress:
    """The batch's side of :class:`~maskserve.model_api.Progress`, on the inference thread: it
    answers from each item's own state and times the forward pass apart from the rest."""

    def __init__(self, items: Sequence[WorkItem]) -> None:
        self.items = items
        self.started = time.perf_counter()
        self.forward_s: float | None = None

    def forward_done(self) -> None:
        if self.forward_s is None:  # an isolating split runs more passes: the first one is timed
            self.forward_s = time.perf_counter() - self.started

    def wanted(self, index: int) -> bool:
        return self.items[index].wanted()


@dataclass(frozen=True)
class Outcome:
    """The inference thread's result for a batch: per item an answer, an error, or None (dropped)."""

    answers: list[TextAnswer | Exception | None]
    seconds: float
    forward_seconds: float | None
    # The post-processing work done for the texts that were answered.
    finished: Work

    def report(self, batch: Sequence[WorkItem], failed: int, number: int, started_ns: int = 0) -> BatchReport:
        """What the pass over ``batch`` did, for the batch's listeners."""
        return BatchReport(
            size=len(batch),
            real_tokens=sum(item.n_tokens for item in batch),
            padded_tokens=padded_cost([item.n_tokens for item in batch]),
            seconds=self.seconds,
            failed=failed,
            started_ns=started_ns,
            number=number,
            # Each request's context once; contexts need not be hashable (OpenTelemetry's are not).
            contexts=tuple({id(item.context): item.context for item in batch if item.context is not None}.values()),
            forward_seconds=self.forward_seconds,
            predictions=self.finished.predictions,
            prediction_tokens=self.finished.prediction_tokens,
        )


def infer(model: FillMaskModel, batch: Sequence[WorkItem]) -> Outcome:
    """Compute ``batch``, post-process the texts still wanted, and time both phases."""
    progress = BatchProgress(batch)
    results = predict_isolating(model, [item.query for item in batch], progress)
    answers: list[TextAnswer | Exception | None] = []
    finished = Work()
    for item, result in zip(batch, results):
        if isinstance(result, Exception):
            answers.append(result)
        elif not item.wanted():
            answers.append(None)
        else:
            # An answer the server reads itself is never sent: its JSON would be thrown away.
            answers.append(TextAnswer(result, b"" if item.query.read_by_server else text_answer_json(result)))
            finished += item.work
    return Outcome(answers, time.perf_counter() - progress.started, progress.forward_s, finished)
