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
from .packing import choose_batch

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
    """One text's predictions and how it was served, for the timing headers, metrics and traces."""

    predictions: TextPredictions
    queued_s: float
    inference_s: float
    batch_size: int
    # When its forward pass began (epoch nanoseconds, for trace spans) and which pass it was.
    started_ns: int = 0
    batch_number: int = 0


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


@dataclass(frozen=True)
class BatchReport:
    """What one forward pass did; sent to every listener (metrics, the cost estimate)."""

    size: int
    real_tokens: int
    padded_tokens: int
    seconds: float
    failed: int
    # When the pass began (epoch nanoseconds), its number (1, 2, ...), and the contexts of the
    # items it served that carried one (WorkItem.context), each once.
    started_ns: int = 0
    number: int = 0
    contexts: tuple[object, ...] = ()


@dataclass
class DropCounts:
    """Items removed before inference: deadline passed, or the client stopped waiting."""

    expired: int = 0
    abandoned: int = 0


class CostModel:
    """Seconds a forward pass takes, as ``fixed + per_token x padded tokens``.

    Fitted by exponentially weighted least squares over recent batches, so it follows the model,
    the machine and the load as they change. It predicts how long queued work will take (for
    Retry-After, admission and dropping requests that cannot make their deadline) and weighs a
    split into sub-batches against one padded batch. Until a batch is measured it predicts 0:
    never refuse on a guess.
    """

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, report: BatchReport) -> None:
        x, y, d = float(report.padded_tokens), report.seconds, self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + x
        self._y = d * self._y + y
        self._xx = d * self._xx + x * x
        self._xy = d * self._xy + x * y

    @property
    def measured(self) -> bool:
        return self._w > 0

    def coefficients(self) -> tuple[float, float]:
        """(fixed seconds per batch, seconds per padded token), both >= 0."""
        if not self.measured:
            return 0.0, 0.0
        mean_x, mean_y = self._x / self._w, self._y / self._w
        variance = self._xx / self._w - mean_x * mean_x
        if variance <= 1e-9 * max(1.0, mean_x * mean_x):
            # All batches had the same size: no slope to fit yet. Charge it all to the pass: a
            # short first batch (often a cold one) must not be extrapolated per token to a deep
            # queue of long texts, and an unsplit batch is the safe default for packing.
            return mean_y, 0.0
        per_token = max(0.0, (self._xy / self._w - mean_x * mean_y) / variance)
        fixed = max(0.0, mean_y - per_token * mean_x)
        return fixed, per_token

    def predict(self, padded_tokens: int, batches: int = 1) -> float:
        fixed, per_token = self.coefficients()
        return fixed * batches + per_token * padded_tokens


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


# How many waiting texts the packer looks at per batch: enough to sort lengths apart, few enough
# that planning stays well under a millisecond (it runs on the event loop).
PACKING_WINDOW_BATCHES = 2


class Batcher:
    """Owns the queue and the batch loop; start :meth:`run` as one task."""

    def __init__(self, model: FillMaskModel, executor: Executor, limits: BatchLimits) -> None:
        self.model = model
        self.executor = executor
        self.limits = limits
        self.cost = CostModel()
        self.drops = DropCounts()
        self.listeners: list[Callable[[BatchReport], None]] = [self.cost.observe]
        self.batches_run = 0
        self.last_progress = time.monotonic()  # refreshed by the inference thread (heartbeat)
        self._queue: deque[WorkItem] = deque()
        self._queued_tokens = 0
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
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

    @property
    def busy_for(self) -> float:
        """Seconds the forward pass in flight has been running; 0 when idle."""
        in_flight = self._in_flight
        return 0.0 if in_flight is None else time.monotonic() - in_flight.started

    def is_full(self, extra: int = 1) -> bool:
        if self.depth + extra > self.limits.max_queue:
            # Texts whose clients left or timed out hold their slots until the next batch is
            # formed, which a hung forward pass delays: free them before refusing anyone.
            self._discard_done()
        return self.depth + extra > self.limits.max_queue

    def predicted_wait(self, extra_texts: int = 0, extra_tokens: int = 0) -> float:
        """Seconds until texts queued now would have their answers, by the measured cost."""
        remaining = 0.0
        if self._in_flight is not None:
            remaining = max(0.0, self._in_flight.predicted_s - self.busy_for)
        texts = self.depth + extra_texts
        if texts == 0:
            return remaining
        batches = -(-texts // self.limits.max_batch_size)
        return remaining + self.cost.predict(self._queued_tokens + extra_tokens, batches=batches)

    def retry_after(self) -> float:
        """Seconds until the work ahead is done, by the measured cost; at least 1."""
        return max(1.0, self.predicted_wait())

    def _admit(self, texts: int) -> None:
        """Raise unless ``texts`` more texts may be queued now."""
        if self._closed:
            raise ShuttingDown("the server is shutting down and accepts no new work", retry_after=1.0)
        if self.is_full(texts):
            raise Overloaded("the queue is full; retry later", retry_after=self.retry_after())

    def submit(self, query: Query, deadline: float, context: object = None) -> asyncio.Future[Answer]:
        """Queue one text; ``deadline`` is on the event loop's clock. Raises when refused."""
        self._admit(1)
        return self._enqueue(query, deadline, context)

    def _enqueue(self, query: Query, deadline: float, context: object) -> asyncio.Future[Answer]:
        loop = asyncio.get_running_loop()
        item = WorkItem(
            query=query, future=loop.create_future(), enqueued_at=loop.time(), deadline=deadline, context=context
        )
        self._queue.append(item)
        self._queued_tokens += item.n_tokens
        self._idle.clear()
        self._arrived.set()
        return item.future

    async def answer(self, queries: Sequence[Query], deadline: float, context: object = None) -> list[Answer]:
        """Queue every text of one request and wait for all, or raise by the deadline.

        Admission is all-or-nothing, so a request is never half queued. On timeout or
        cancellation (the client left) the futures are cancelled, and the batch loop drops
        them before they cost a forward pass.
        """
        self._admit(len(queries))
        futures = [self._enqueue(query, deadline, context) for query in queries]
        try:
            async with asyncio.timeout_at(deadline):
                return list(await asyncio.gather(*futures))
        except TimeoutError:
            raise DeadlineExceeded("the request did not finish within its deadline") from None
        finally:
            for future in futures:
                future.cancel()  # no-op on finished ones; frees the others' queue slots

    def close(self) -> None:
        """Stop intake: every later :meth:`submit` raises :class:`ShuttingDown`."""
        self._closed = True
        self._arrived.set()

    def fail_pending(self, error: Exception) -> int:
        """Answer everything still queued with ``error``; returns how many were waiting."""
        failed = 0
        while self._queue:
            item = self._pop()
            if not item.future.done():
                item.future.set_exception(error)
                failed += 1
        return failed

    async def drain(self, budget: float) -> bool:
        """After :meth:`close`, wait up to ``budget`` seconds for the queue and the batch in flight."""
        try:
            async with asyncio.timeout(budget):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    # -- the batch loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Form and run batches until cancelled. Never waits when there is nothing to wait for."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._idle.set()
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

    def _pop(self) -> WorkItem:
        item = self._queue.popleft()
        self._queued_tokens -= item.n_tokens
        return item

    def _sweep(self, now: float) -> None:
        """Drop items at the head that need no forward pass: done, expired, or sure to expire.

        A future is already done when its client left (handler cancelled) or the view's own
        deadline fired. An item whose deadline will pass before even a batch of one could finish
        is answered 504 now instead of costing a forward pass it cannot use.
        """
        while self._queue:
            item = self._queue[0]
            if item.future.done():
                self._pop()
                self._count_drop(item, now)
            elif now + self.cost.predict(item.n_tokens) >= item.deadline:
                self._pop()
                self.drops.expired += 1
                item.future.set_exception(DeadlineExceeded("the request could not finish within its deadline"))
            else:
                return

    def _count_drop(self, item: WorkItem, now: float) -> None:
        if now >= item.deadline:
            self.drops.expired += 1
        else:
            self.drops.abandoned += 1

    def _discard_done(self) -> None:
        """Remove every item whose future is done, wherever it waits (O(queue), so only when full)."""
        now = asyncio.get_running_loop().time()
        live: deque[WorkItem] = deque()
        for item in self._queue:
            if item.future.done():
                self._queued_tokens -= item.n_tokens
                self._count_drop(item, now)
            else:
                live.append(item)
        self._queue = live

    def _take_batch(self, now: float) -> list[WorkItem]:
        """Choose the next batch: packed by length, always holding the oldest live item."""
        self._sweep(now)
        window: list[WorkItem] = []
        for item in self._queue:
            if len(window) >= PACKING_WINDOW_BATCHES * self.limits.max_batch_size:
                break
            if not item.future.done():
                window.append(item)
        if not window:
            return []
        chosen = choose_batch(
            [item.n_tokens for item in window],
            max_batch_size=self.limits.max_batch_size,
            max_batch_tokens=self.limits.max_batch_tokens,
            batch_overhead_tokens=self._batch_overhead_tokens(),
        )
        batch = [window[i] for i in chosen]
        taken = {id(item) for item in batch}
        self._queue = deque(item for item in self._queue if id(item) not in taken)
        self._queued_tokens -= sum(item.n_tokens for item in batch)
        return batch

    def _batch_overhead_tokens(self) -> float:
        """The fixed cost of a forward pass, in tokens of compute: what a split must save."""
        fixed, per_token = self.cost.coefficients()
        if per_token > 0:
            return fixed / per_token
        # Unmeasured: assume a pass costs 32 tokens. Measured without a slope: never split.
        return float("inf") if fixed > 0 else 32.0

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        queries = [item.query for item in batch]
        padded = len(batch) * max(item.n_tokens for item in batch)
        started, started_ns = loop.time(), time.time_ns()
        self._in_flight = _InFlight(started=time.monotonic(), predicted_s=self.cost.predict(padded))
        try:
            outcomes, seconds = await loop.run_in_executor(self.executor, self._infer, queries)
        except Exception:  # a bug in the isolation itself: fail this batch only, keep serving
            log.exception("batch of %d failed outside the model", len(batch))
            outcomes, seconds = [InferenceFailed("inference failed")] * len(batch), loop.time() - started
        finally:
            self._in_flight = None
        self.batches_run += 1
        number = self.batches_run
        failed = 0
        for item, outcome in zip(batch, outcomes):
            if isinstance(outcome, Exception):
                failed += 1
                log.error("inference failed for one input", exc_info=outcome)
                if not item.future.done():
                    item.future.set_exception(InferenceFailed("the model failed on this input"))
            elif not item.future.done():  # else the client left or timed out while its batch ran
                item.future.set_result(
                    Answer(
                        outcome,
                        queued_s=started - item.enqueued_at,
                        inference_s=seconds,
                        batch_size=len(batch),
                        started_ns=started_ns,
                        batch_number=number,
                    )
                )
        report = BatchReport(
            size=len(batch),
            real_tokens=sum(item.n_tokens for item in batch),
            padded_tokens=padded,
            seconds=seconds,
            failed=failed,
            started_ns=started_ns,
            number=number,
            # Each request's context once; contexts need not be hashable (OpenTelemetry's are not).
            contexts=tuple({id(item.context): item.context for item in batch if item.context is not None}.values()),
        )
        for listener in self.listeners:
            try:
                listener(report)
            except Exception:  # an observer's bug (metrics, tracing) must not stop the batch loop
                log.exception("a batch listener failed")

    def _infer(self, queries: list[Query]) -> tuple[list[TextPredictions | Exception], float]:
        """The inference thread's whole job: compute, time it, refresh the heartbeat."""
        started = time.perf_counter()
        self.last_progress = time.monotonic()
        outcomes = predict_isolating(self.model, queries)
        self.last_progress = time.monotonic()
        return outcomes, time.perf_counter() - started
