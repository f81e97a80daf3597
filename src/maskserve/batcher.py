"""The bounded queue, the batch loop and the one inference thread.

Requests become :class:`WorkItem` records on a bounded queue. One coroutine, :meth:`Batcher.run`,
takes what is queued whenever the model is free, forms a batch within the size, token and delay
limits, and runs it on a single-thread executor: the event loop never runs the model, and the
model never runs two batches at once. Futures are resolved back on the event loop, and only
while still pending (a client that left or timed out has already cancelled its own).

The inference thread also does each text's post-processing (top-k, decoding every prediction's
``sequence``, the JSON), asking between texts and between masks whether anyone still waits: a
request answered 504, or whose client left, costs nothing more. Both phases are timed apart and
fitted by :class:`CostModel`, so the predicted wait that admission, ``Retry-After`` and the stall
budget use covers the whole of a request's cost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from .errors import DeadlineExceeded, InferenceFailed, Overloaded, ShuttingDown
from .model_api import FillMaskModel, Progress, Query, TextPredictions, text_answer_json
from .packing import choose_batch
from .settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Work:
    """How much a set of texts costs to answer: the quantities the cost model is fitted on."""

    texts: int = 0
    tokens: int = 0
    predictions: int = 0
    # Predictions x their text's tokens: decoding each prediction's ``sequence`` costs its length.
    prediction_tokens: int = 0

    @classmethod
    def of(cls, queries: Sequence[Query]) -> Work:
        if len(queries) == 1:  # the common case, once per text queued: no generators
            query = queries[0]
            return cls(1, query.n_tokens, query.predictions, query.prediction_tokens)
        return cls(
            texts=len(queries),
            tokens=sum(q.n_tokens for q in queries),
            predictions=sum(q.predictions for q in queries),
            prediction_tokens=sum(q.prediction_tokens for q in queries),
        )

    def __add__(self, other: Work) -> Work:
        return Work(
            self.texts + other.texts,
            self.tokens + other.tokens,
            self.predictions + other.predictions,
            self.prediction_tokens + other.prediction_tokens,
        )

    def __sub__(self, other: Work) -> Work:
        return Work(
            self.texts - other.texts,
            self.tokens - other.tokens,
            self.predictions - other.predictions,
            self.prediction_tokens - other.prediction_tokens,
        )


# One text of one token: the least a request adds to the queue, for the check at the door.
ONE_TEXT = Work(texts=1)


@dataclass(frozen=True)
class TextAnswer:
    """What the inference thread hands back for one text: its predictions, and them as JSON."""

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
    # Of ``seconds``, the forward pass's own (None: all of it), and the post-processing the rest
    # spent on the texts it finished: their predictions, and predictions x tokens.
    forward_seconds: float | None = None
    predictions: int = 0
    prediction_tokens: int = 0


@dataclass
class DropCounts:
    """Items removed before inference: deadline passed, or the client stopped waiting."""

    expired: int = 0
    abandoned: int = 0


class LinearCost:
    """Seconds as ``a x f1 + b x f2`` (both coefficients >= 0), fitted by exponentially weighted
    least squares over recent observations, so that it follows the model, the machine and the load
    as they change. Until something is observed it predicts 0: never refuse on a guess.

    Recent traffic is often all alike (short sentences, a few predictions each): it says well what
    such work costs, and nothing of how the cost grows with length. :meth:`anchor` keeps what has
    been observed so far (warm-up's passes, of very different lengths) as a prior that never
    fades, with the weight of a couple of observations: it settles the directions recent traffic
    leaves open, and yields to it in the others. When nothing tells the two features apart
    (always the same ratio), everything is charged to ``f1``.
    """

    # The prior's weight, in observations: enough to fix what recent traffic cannot, little
    # enough that a machine that got slower under load is followed.
    PRIOR_WEIGHT = 2.0

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        # Weighted sums: count, f1 f1, f1 f2, f2 f2, f1 y, f2 y; recent ones, and the prior's.
        self._sums = [0.0] * 6
        self._prior = [0.0] * 6
        # The fit, solved once per change: every request asks for predictions several times.
        self._fit: tuple[float, float] | None = None

    def observe(self, f1: float, f2: float, seconds: float) -> None:
        d = self.decay
        for i, value in enumerate((1.0, f1 * f1, f1 * f2, f2 * f2, f1 * seconds, f2 * seconds)):
            self._sums[i] = d * self._sums[i] + value
        self._fit = None

    def anchor(self) -> None:
        """Keep what has been observed so far as the prior (see the class docstring)."""
        if self._sums[0] > 0:
            scale = self.PRIOR_WEIGHT / self._sums[0]
            self._prior = [value * scale for value in self._sums]
        self._fit = None

    @property
    def measured(self) -> bool:
        return self._sums[0] + self._prior[0] > 0

    def coefficients(self) -> tuple[float, float]:
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float]:
        n, s11, s12, s22, s1y, s2y = (a + b for a, b in zip(self._sums, self._prior))
        if n <= 0 or s11 + s22 <= 0:
            return 0.0, 0.0
        det = s11 * s22 - s12 * s12
        if det <= 1e-9 * s11 * s22 or s11 == 0:
            if s11 > 0:
                return max(0.0, s1y / s11), 0.0
            return 0.0, max(0.0, s2y / s22)
        a = (s1y * s22 - s2y * s12) / det
        b = (s2y * s11 - s1y * s12) / det
        if b < 0:  # the second feature adds nothing: refit on the first alone
            return max(0.0, s1y / s11), 0.0
        if a < 0:
            return 0.0, max(0.0, s2y / s22)
        return a, b

    def predict(self, f1: float, f2: float) -> float:
        a, b = self.coefficients()
        return a * f1 + b * f2


class CostModel:
    """Seconds a batch takes: its forward pass as ``fixed + per_token x padded tokens``, and its
    post-processing as ``per_prediction x predictions + per_decoded_token x predictions x tokens``.

    It predicts how long queued work will take (for Retry-After, admission, the stall budget and
    dropping requests that cannot make their deadline) and weighs a split into sub-batches against
    one padded batch.
    """

    def __init__(self, decay: float = 0.9) -> None:
        self.forward = LinearCost(decay)  # f1 = passes, f2 = padded tokens
        self.post = LinearCost(decay)  # f1 = predictions, f2 = prediction tokens

    def observe(self, report: BatchReport) -> None:
        forward = report.seconds if report.forward_seconds is None else report.forward_seconds
        self.forward.observe(1.0, float(report.padded_tokens), forward)
        if report.predictions > 0:
            post = max(0.0, report.seconds - forward)
            self.post.observe(float(report.predictions), float(report.prediction_tokens), post)

    @property
    def measured(self) -> bool:
        return self.forward.measured

    def coefficients(self) -> tuple[float, float]:
        """The forward pass's (fixed seconds per pass, seconds per padded token), both >= 0."""
        return self.forward.coefficients()

    def predict(self, padded_tokens: int, batches: int = 1) -> float:
        """Seconds of forward passes over ``padded_tokens`` in ``batches`` passes."""
        return self.forward.predict(batches, padded_tokens)

    def post_processing(self, work: Work) -> float:
        """Seconds of picking, decoding and encoding ``work``'s predictions."""
        return self.post.predict(work.predictions, work.prediction_tokens)


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


class _BatchProgress:
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
class _Outcome:
    """The inference thread's result for a batch: per item an answer, an error, or None (dropped)."""

    answers: list[TextAnswer | Exception | None]
    seconds: float
    forward_seconds: float | None
    # The post-processing work done for the texts that were answered.
    finished: Work


@dataclass
class _InFlight:
    started: float
    predicted_s: float


# How many waiting texts the packer looks at per batch: enough to sort lengths apart, few enough
# that planning stays well under a millisecond (it runs on the event loop).
PACKING_WINDOW_BATCHES = 2
# The stall budget is this many times the longest batch the limits admit: a pass that runs past
# it is not slow, it is stuck.
STALL_MULTIPLE = 4.0
# ... or this many times the longest pass seen so far, which a busy machine may stretch.
STALL_OBSERVED_MULTIPLE = 2.0


class Batcher:
    """Owns the queue and the batch loop; start :meth:`run` as one task."""

    def __init__(self, model: FillMaskModel, executor: Executor, settings: Settings) -> None:
        self.model = model
        self.executor = executor
        # The batch and queue limits are the settings' own (max_batch_size, max_queue, ...).
        self.limits = settings
        self.cost = CostModel()
        self.drops = DropCounts()
        self.listeners: list[Callable[[BatchReport], None]] = [self.cost.observe]
        self.batches_run = 0
        self.last_progress = time.monotonic()  # refreshed by the inference thread (heartbeat)
        # The longest batch the limits admit as predicted when warm-up measured the model, and
        # the longest pass seen since: floors of the stall budget that recent short batches,
        # which the cost model follows, cannot wear down.
        self.calibrated_longest_s = 0.0
        self.longest_pass_s = 0.0
        self._queue: deque[WorkItem] = deque()
        self._queued = Work()
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
        """Seconds the batch in flight has held the inference thread; 0 when idle."""
        in_flight = self._in_flight
        return 0.0 if in_flight is None else time.monotonic() - in_flight.started

    def is_full(self, extra: int = 1) -> bool:
        if self.depth + extra > self.limits.max_queue:
            # Texts whose clients left or timed out hold their slots until the next batch is
            # formed, which a hung forward pass delays: free them before refusing anyone.
            self._discard_done()
        return self.depth + extra > self.limits.max_queue

    def seconds_for(self, work: Work) -> float:
        """Predicted seconds to answer ``work`` from an idle model: its passes and its post-processing."""
        if work.texts == 0:
            return 0.0
        limits = self.limits
        # At least as many passes as the size and the token budget each require (a lower
        # bound: padding needs more), and never fewer than one.
        batches = max(-(-work.texts // limits.max_batch_size), -(-work.tokens // limits.max_batch_tokens), 1)
        return self.cost.predict(work.tokens, batches=batches) + self.cost.post_processing(work)

    def predicted_wait(self, extra: Work = Work()) -> float:
        """Seconds until texts queued now (plus ``extra``) would have their answers, by the measured cost."""
        remaining = 0.0
        if self._in_flight is not None:
            remaining = max(0.0, self._in_flight.predicted_s - self.busy_for)
        return remaining + self.seconds_for(self._queued + extra)

    def retry_after(self) -> float:
        """Seconds until the work ahead is done, by the measured cost; at least 1."""
        return max(1.0, self.predicted_wait())

    def longest_batch_s(self) -> float:
        """Predicted seconds of the costliest batch the limits admit: a full token budget in one
        pass, then the most predictions each of its texts may ask for, decoded at full length."""
        limits = self.limits
        texts = limits.max_batch_size
        tokens = max(limits.max_batch_tokens, self.model.max_tokens)
        predictions = texts * limits.max_text_predictions
        worst = Work(texts, tokens, predictions, limits.max_text_predictions * tokens)
        return self.cost.predict(tokens) + self.cost.post_processing(worst)

    def stall_budget(self, floor: float) -> float:
        """Seconds one batch may hold the inference thread before it counts as stuck: a multiple
        of the longest batch the limits admit (and of the longest seen), never less than ``floor``.

        No admitted request can then trip it, on any machine: it is measured here.
        """
        longest = max(self.calibrated_longest_s, self.longest_batch_s())
        return max(floor, STALL_MULTIPLE * longest, STALL_OBSERVED_MULTIPLE * self.longest_pass_s)

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
        self._queued += item.work
        self._idle.clear()
        self._arrived.set()
        return item.future

    async def answer(self, queries: Sequence[Query], deadline: float, context: object = None) -> list[Answer]:
        """Queue every text of one request and wait for all, or raise by the deadline.

        Admission is all-or-nothing, so a request is never half queued. On timeout or
        cancellation (the client left) the futures are cancelled, and neither the batch loop nor
        the inference thread spends anything more on them.
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

    # -- warm-up --------------------------------------------------------------------------------

    async def warm_up(self, top_k: int) -> float:
        """Run a few batches of short and longest texts before serving; returns the seconds spent.

        The first pass pays the model's one-time start-up costs, and is not measured. The others
        are of different lengths and answer sizes (up to ``top_k`` predictions of a text as long as
        the model reads), so both parts of the cost model are fitted before the first request:
        admission and the stall budget start from this machine's real costs.
        """
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        model = self.model
        longest = max(2, model.max_tokens)

        def text(tokens: int, answers: int) -> Query:
            ids = model.encode(f"{'the ' * max(0, tokens - 4)}{model.mask_token} .")
            if len(ids) > tokens:  # keep the first token and the tail, which holds the mask
                ids = ids[:1] + ids[len(ids) - tokens + 1 :]
            return Query(ids, top_k=max(1, answers), n_masks=model.count_masks(ids))

        plan = [
            [text(8, 5)],  # cold
            [text(8, 5)],
            [text(max(8, longest // 8), 5)] * 8,
            [text(longest, top_k)],
            [text(max(8, longest // 4), top_k)] * 2,
        ]
        for number, queries in enumerate(plan):
            items = [
                WorkItem(query, loop.create_future(), loop.time(), loop.time() + 3600.0, None) for query in queries
            ]
            outcome = await loop.run_in_executor(self.executor, self._infer, items)
            for item in items:
                item.future.cancel()
            if number > 0:
                self.cost.observe(self._report(items, outcome, 0, 0))
        self.cost.forward.anchor()
        self.cost.post.anchor()
        self.calibrated_longest_s = self.longest_batch_s()
        self.longest_pass_s = 0.0  # the cold pass is no measure of a stall
        return time.perf_counter() - started

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

        The window is counted once from the oldest waiting item (never restarted per arrival),
        and skipped entirely when the delay is 0.
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
        self._queued -= item.work
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
            elif now + self.seconds_for(item.work) >= item.deadline:
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
                self._queued -= item.work
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
        self._queued -= Work.of([item.query for item in batch])
        return batch

    def _batch_overhead_tokens(self) -> float:
        """The fixed cost of a forward pass, in tokens of compute: what a split must save."""
        fixed, per_token = self.cost.coefficients()
        if per_token > 0:
            return fixed / per_token
        # Unmeasured: assume a pass costs 32 tokens. Measured without a slope: never split.
        return float("inf") if fixed > 0 else 32.0

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        padded = len(batch) * max(item.n_tokens for item in batch)
        started, started_ns = loop.time(), time.time_ns()
        predicted = self.cost.predict(padded) + self.cost.post_processing(Work.of([item.query for item in batch]))
        self._in_flight = _InFlight(started=time.monotonic(), predicted_s=predicted)
        try:
            outcome = await loop.run_in_executor(self.executor, self._infer, batch)
        except Exception:  # a bug in the isolation itself: fail this batch only, keep serving
            log.exception("batch of %d failed outside the model", len(batch))
            failure: list[TextAnswer | Exception | None] = [InferenceFailed("inference failed")] * len(batch)
            outcome = _Outcome(failure, loop.time() - started, None, Work())
        finally:
            self._in_flight = None
        self.batches_run += 1
        number = self.batches_run
        failed = 0
        for item, result in zip(batch, outcome.answers):
            if item.future.done():  # the client left or timed out while its batch ran
                continue
            if isinstance(result, Exception):
                failed += 1
                log.error("inference failed for one input", exc_info=result)
                item.future.set_exception(InferenceFailed("the model failed on this input"))
            elif result is None:  # the inference thread saw its deadline pass, and stopped
                self.drops.expired += 1
                item.future.set_exception(DeadlineExceeded("the request did not finish within its deadline"))
            else:
                item.future.set_result(
                    Answer(
                        result.predictions,
                        queued_s=started - item.enqueued_at,
                        inference_s=outcome.seconds,
                        batch_size=len(batch),
                        started_ns=started_ns,
                        batch_number=number,
                        json=result.json,
                    )
                )
        report = self._report(batch, outcome, failed, number, started_ns)
        for listener in self.listeners:
            try:
                listener(report)
            except Exception:  # an observer's bug (metrics, tracing) must not stop the batch loop
                log.exception("a batch listener failed")

    def _report(
        self, batch: Sequence[WorkItem], outcome: _Outcome, failed: int, number: int, started_ns: int = 0
    ) -> BatchReport:
        return BatchReport(
            size=len(batch),
            real_tokens=sum(item.n_tokens for item in batch),
            padded_tokens=len(batch) * max(item.n_tokens for item in batch),
            seconds=outcome.seconds,
            failed=failed,
            started_ns=started_ns,
            number=number,
            # Each request's context once; contexts need not be hashable (OpenTelemetry's are not).
            contexts=tuple({id(item.context): item.context for item in batch if item.context is not None}.values()),
            forward_seconds=outcome.forward_seconds,
            predictions=outcome.finished.predictions,
            prediction_tokens=outcome.finished.prediction_tokens,
        )

    def _infer(self, batch: Sequence[WorkItem]) -> _Outcome:
        """The inference thread's whole job: compute, post-process what is still wanted, time it,
        refresh the heartbeat."""
        self.last_progress = time.monotonic()
        progress = _BatchProgress(batch)
        results = predict_isolating(self.model, [item.query for item in batch], progress)
        answers: list[TextAnswer | Exception | None] = []
        finished = Work()
        for item, result in zip(batch, results):
            if isinstance(result, Exception):
                answers.append(result)
            elif not item.wanted():
                answers.append(None)
            else:
                answers.append(TextAnswer(result, text_answer_json(result)))
                finished += item.work
        seconds = time.perf_counter() - progress.started
        self.last_progress = time.monotonic()
        self.longest_pass_s = max(self.longest_pass_s, seconds)
        return _Outcome(answers, seconds, progress.forward_s, finished)
