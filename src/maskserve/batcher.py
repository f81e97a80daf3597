"""The bounded queue, the batch loop and the one inference thread.

Requests become :class:`WorkItem` records on a bounded queue. One coroutine, :meth:`Batcher.run`,
takes what is queued whenever the model is free, forms a batch within the size, token and delay
limits, and runs it on a single-thread executor: the event loop never runs the model, and the
model never runs two batches at once. Futures are resolved back on the event loop, and only
while still pending (a client that left or timed out has already cancelled its own).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from .errors import DeadlineExceeded, InferenceFailed, Overloaded, ShuttingDown
from .model_api import FillMaskModel, Query, TextPredictions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchLimits:
    """How large and how late a batch may be (see the settings of the same names)."""

    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    max_batch_delay: float = 0.0
    max_queue: int = 256


@dataclass(frozen=True)
class Answer:
    """One text's predictions and how it was served, for the timing headers and metrics."""

    predictions: TextPredictions
    queued_s: float
    inference_s: float
    batch_size: int


@dataclass(eq=False)
class WorkItem:
    """One text waiting for the model, carrying its own reply future and clock readings."""

    query: Query
    future: asyncio.Future[Answer]
    enqueued_at: float
    deadline: float

    @property
    def n_tokens(self) -> int:
        return self.query.n_tokens


@dataclass(frozen=True)
class BatchReport:
    """What one forward pass did; sent to every listener (metrics, the cost estimate)."""

    size: int
    real_tokens: int
    padded_tokens: int
    seconds: float
    failed: int


@dataclass
class DropCounts:
    """Items removed before inference: deadline passed, or the client stopped waiting."""

    expired: int = 0
    abandoned: int = 0


class CostEstimate:
    """Exponentially weighted seconds per padded token and per batch, from measured batches.

    Used to predict how long a newly queued text waits, for Retry-After and admission.
    Until the first batch is measured the prediction is 0: never refuse on a guess.
    """

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.seconds_per_token: float | None = None
        self.seconds_per_batch: float | None = None

    def observe(self, report: BatchReport) -> None:
        per_token = report.seconds / max(1, report.padded_tokens)
        if self.seconds_per_token is None or self.seconds_per_batch is None:
            self.seconds_per_token, self.seconds_per_batch = per_token, report.seconds
            return
        self.seconds_per_token += self.alpha * (per_token - self.seconds_per_token)
        self.seconds_per_batch += self.alpha * (report.seconds - self.seconds_per_batch)

    def predict(self, padded_tokens: int) -> float:
        if self.seconds_per_token is None:
            return 0.0
        return padded_tokens * self.seconds_per_token


def predict_isolating(model: FillMaskModel, queries: Sequence[Query]) -> list[TextPredictions | Exception]:
    """Run one batch; if it raises, split it in halves until the failing inputs stand alone.

    Runs on the inference thread. One poisoned input (or an out-of-memory batch) then costs its
    neighbours a few extra forward passes instead of their answers.
    """
    try:
        answers = model.predict(queries)
    except Exception as exc:  # noqa: BLE001 - any model failure is isolated the same way
        if len(queries) == 1:
            return [exc]
        middle = len(queries) // 2
        return predict_isolating(model, queries[:middle]) + predict_isolating(model, queries[middle:])
    if len(answers) != len(queries):
        raise RuntimeError(f"model returned {len(answers)} answers for {len(queries)} queries; this is a bug")
    return list(answers)


@dataclass
class _InFlight:
    started: float
    predicted_s: float


class Batcher:
    """Owns the queue and the batch loop; start :meth:`run` as one task."""

    def __init__(self, model: FillMaskModel, executor: Executor, limits: BatchLimits) -> None:
        self.model = model
        self.executor = executor
        self.limits = limits
        self.cost = CostEstimate()
        self.drops = DropCounts()
        self.listeners: list[Callable[[BatchReport], None]] = [self.cost.observe]
        self.batches_run = 0
        self.last_progress = time.monotonic()  # refreshed by the inference thread (heartbeat)
        self._queue: deque[WorkItem] = deque()
        self._arrived = asyncio.Event()
        self._closed = False
        self._in_flight: _InFlight | None = None

    # -- intake (event loop) ------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Texts waiting (cancelled ones are counted until the loop sweeps them)."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def is_full(self, extra: int = 1) -> bool:
        return self.depth + extra > self.limits.max_queue

    def predicted_wait(self, extra_tokens: int = 0) -> float:
        """Seconds until a text queued now, of ``extra_tokens``, would have its answer."""
        loop_now = time.monotonic()
        remaining = 0.0
        if self._in_flight is not None:
            remaining = max(0.0, self._in_flight.predicted_s - (loop_now - self._in_flight.started))
        queued_tokens = sum(item.n_tokens for item in self._queue) + extra_tokens
        return remaining + self.cost.predict(queued_tokens)

    def submit(self, query: Query, deadline: float) -> asyncio.Future[Answer]:
        """Queue one text; ``deadline`` is on the event loop's clock. Raises when refused."""
        if self._closed:
            raise ShuttingDown("the server is shutting down and accepts no new work", retry_after=1.0)
        if self.is_full():
            raise Overloaded("the queue is full; retry later", retry_after=self.retry_after())
        loop = asyncio.get_running_loop()
        item = WorkItem(query=query, future=loop.create_future(), enqueued_at=loop.time(), deadline=deadline)
        self._queue.append(item)
        self._arrived.set()
        return item.future

    async def answer(self, queries: Sequence[Query], deadline: float) -> list[Answer]:
        """Queue every text of one request and wait for all, or raise by the deadline.

        Admission is all-or-nothing, so a request is never half queued. On timeout or
        cancellation (the client left) the futures are cancelled, and the batch loop drops
        them before they cost a forward pass.
        """
        if self._closed:
            raise ShuttingDown("the server is shutting down and accepts no new work", retry_after=1.0)
        if self.is_full(len(queries)):
            raise Overloaded("the queue is full; retry later", retry_after=self.retry_after())
        futures = [self.submit(query, deadline) for query in queries]
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(remaining):
                return list(await asyncio.gather(*futures))
        except TimeoutError:
            raise DeadlineExceeded("the request did not finish within its deadline") from None
        finally:
            for future in futures:
                future.cancel()  # no-op on finished ones; frees the others' queue slots

    def retry_after(self) -> float:
        """Seconds until the work ahead is done, by the measured cost; at least 1."""
        return max(1.0, self.predicted_wait())

    def close(self) -> None:
        """Stop intake: every later :meth:`submit` raises :class:`ShuttingDown`."""
        self._closed = True
        self._arrived.set()

    def fail_pending(self, error: Exception) -> int:
        """Answer everything still queued with ``error``; returns how many were waiting."""
        failed = 0
        while self._queue:
            item = self._queue.popleft()
            if not item.future.done():
                item.future.set_exception(error)
                failed += 1
        return failed

    async def drain(self, timeout: float) -> bool:
        """After :meth:`close`, wait up to ``timeout`` s for the queue and the batch in flight."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while (self._queue or self._in_flight is not None) and loop.time() < end:
            await asyncio.sleep(0.01)
        return not self._queue and self._in_flight is None

    # -- the batch loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Form and run batches until cancelled. Never waits when there is nothing to wait for."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._wait_for_company(loop)
            batch = self._take_batch(loop.time())
            if batch:
                await self._run_batch(loop, batch)

    async def _wait_for_company(self, loop: asyncio.AbstractEventLoop) -> None:
        """With ``max_batch_delay``, wait until the oldest item's single deadline or a full batch.

        The window is counted once from the oldest waiting item (never restarted per arrival,
        the seed's flaw), and skipped entirely when the delay is 0.
        """
        delay = self.limits.max_batch_delay
        if delay <= 0 or not self._queue:
            return
        close_at = self._queue[0].enqueued_at + delay
        while len(self._queue) < self.limits.max_batch_size and not self._closed:
            remaining = close_at - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _take_batch(self, now: float) -> list[WorkItem]:
        """Take items in arrival order within the size and padded-token budget.

        Items whose future is done (client gone, deadline handled by the view) or whose deadline
        has passed are dropped here: they never cost a forward pass.
        """
        batch: list[WorkItem] = []
        longest = 0
        while self._queue and len(batch) < self.limits.max_batch_size:
            item = self._queue[0]
            if item.future.done():
                self._queue.popleft()
                if now >= item.deadline:
                    self.drops.expired += 1
                else:
                    self.drops.abandoned += 1
                continue
            if now >= item.deadline:
                self._queue.popleft()
                self.drops.expired += 1
                item.future.set_exception(DeadlineExceeded("the request's deadline passed while it was queued"))
                continue
            new_longest = max(longest, item.n_tokens)
            # Padded cost is texts x longest text; the first item always fits, however long.
            if batch and (len(batch) + 1) * new_longest > self.limits.max_batch_tokens:
                break
            self._queue.popleft()
            batch.append(item)
            longest = new_longest
        return batch

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        queries = [item.query for item in batch]
        padded = len(batch) * max(item.n_tokens for item in batch)
        started = loop.time()
        self._in_flight = _InFlight(started=time.monotonic(), predicted_s=self.cost.predict(padded))
        try:
            outcomes, seconds = await loop.run_in_executor(self.executor, self._infer, queries)
        except Exception:
            log.exception("batch of %d failed outside the model", len(batch))
            outcomes, seconds = [InferenceFailed("inference failed")] * len(batch), loop.time() - started
        finally:
            self._in_flight = None
        self.batches_run += 1
        failed = 0
        for item, outcome in zip(batch, outcomes):
            if item.future.done():
                continue  # the client left or timed out while its batch ran
            if isinstance(outcome, Exception):
                failed += 1
                log.error("inference failed for one input", exc_info=outcome)
                item.future.set_exception(InferenceFailed("the model failed on this input"))
            else:
                item.future.set_result(
                    Answer(outcome, queued_s=started - item.enqueued_at, inference_s=seconds, batch_size=len(batch))
                )
        report = BatchReport(
            size=len(batch),
            real_tokens=sum(item.n_tokens for item in batch),
            padded_tokens=padded,
            seconds=seconds,
            failed=failed,
        )
        for listener in self.listeners:
            listener(report)

    def _infer(self, queries: list[Query]) -> tuple[list[TextPredictions | Exception], float]:
        """The inference thread's whole job: compute, time it, refresh the heartbeat."""
        started = time.perf_counter()
        self.last_progress = time.monotonic()
        outcomes = predict_isolating(self.model, queries)
        self.last_progress = time.monotonic()
        return outcomes, time.perf_counter() - started
