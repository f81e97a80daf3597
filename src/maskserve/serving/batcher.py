"""One model's queue and batches.

Requests become :class:`~maskserve.serving.work_queue.WorkItem` records on one model's
:class:`~maskserve.serving.work_queue.WorkQueue`. Whenever the inference thread is free and the
:class:`~maskserve.serving.scheduler.Scheduler` (one per server, whatever the number of models) picks this
model, :meth:`Batcher.next_batch` forms a batch within the size, token and delay limits and
:meth:`Batcher.run_batch` runs it on the single-thread executor (:mod:`maskserve.serving.inference` is that
thread's side): the event loop never runs a model, and the thread never runs two batches at once.
Futures are resolved back on the event loop, and only while still pending (a client that left or
timed out has already cancelled its own).

The batcher decides nothing about admission (:mod:`maskserve.serving.admission` does, from the queue and
the :class:`~maskserve.serving.costs.CostModel` this model's passes feed), nor which model runs next (the
scheduler does); :meth:`Batcher.next_batch` is the one place that picks this model's next batch.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from maskserve.config.settings import Settings
from maskserve.errors import DeadlineExceeded, InferenceFailed
from maskserve.model_api import FillMaskModel, Query
from maskserve.serving.costs import NO_WORK, BatchReport, CostModel, Work
from maskserve.serving.forecast import Forecast
from maskserve.serving.inference import OnePass, Outcome, infer
from maskserve.serving.packing import choose_batch, padded_cost
from maskserve.serving.scheduler import InFlight, Scheduler
from maskserve.serving.work_queue import Answer, DropCounts, TextAnswer, WorkItem, WorkQueue

log = logging.getLogger(__name__)


# How many waiting texts the packer looks at per batch: enough to sort lengths apart, few enough
# that planning stays well under a millisecond (it runs on the event loop).
PACKING_WINDOW_BATCHES = 2


class Batcher:
    """One model's queue and batches, on a :class:`~maskserve.serving.scheduler.Scheduler`'s thread.

    Without a ``scheduler``, the batcher makes its own on ``executor``, and :meth:`run` is its
    batch loop (one model, as in the tests); with several models, one scheduler serves them all.
    """

    def __init__(
        self,
        model: FillMaskModel,
        executor: Executor,
        settings: Settings,
        *,
        scheduler: Scheduler | None = None,
        name: str = "",
    ) -> None:
        self.model = model
        # The name clients use for this model (its metrics and traces carry it).
        self.name = name or model.name
        self.scheduler = scheduler if scheduler is not None else Scheduler(executor)
        self.scheduler.add(self)
        self.executor = self.scheduler.executor
        # The batch and queue limits are this model's settings' own (max_batch_size, max_queue, ...).
        self.settings = settings
        self.cost = CostModel()
        self.drops = DropCounts()
        self.listeners: list[Callable[[BatchReport], None]] = [self.cost.observe]
        # What this model's work will take, by the cost its passes measure: admission, Retry-After,
        # the scheduler's fair shares and the stall budget read it.
        self.forecast = Forecast(settings, model.max_tokens, self.cost)
        self._queue = WorkQueue()

    # -- intake (event loop) ------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Texts waiting (cancelled ones are counted until the loop sweeps them)."""
        return len(self._queue)

    @property
    def queued_work(self) -> Work:
        """The work of every text waiting (cancelled ones until swept)."""
        return self._queue.work

    @property
    def closed(self) -> bool:
        return self.scheduler.closed

    def is_full(self, extra: int = 1) -> bool:
        """Whether ``extra`` more texts would overflow the queue's bound (admission asks)."""
        if self.depth + extra > self.settings.max_queue:
            # Texts whose clients left or timed out hold their slots until the next batch is
            # formed, which a hung forward pass delays: free them before refusing anyone.
            self._discard_done()
        return self.depth + extra > self.settings.max_queue

    def predicted_wait(self, extra: Work = NO_WORK) -> float:
        """Seconds until texts queued now (plus ``extra``) would have their answers, by the measured
        cost, with the other models' queued work sharing the thread fairly (see the scheduler)."""
        return self.scheduler.predicted_wait(self, self.forecast.seconds_for(self._queue.work + extra))

    def retry_after(self) -> float:
        """Seconds until the work ahead is done, by the measured cost; at least 1."""
        return max(1.0, self.predicted_wait())

    def enqueue(self, query: Query, deadline: float, context: object = None) -> asyncio.Future[Answer]:
        """Queue one text; ``deadline`` is on the event loop's clock. Admission is the caller's."""
        loop = asyncio.get_running_loop()
        item = WorkItem(
            query=query, future=loop.create_future(), enqueued_at=loop.time(), deadline=deadline, context=context
        )
        self._queue.append(item)
        self.scheduler.wake()
        return item.future

    async def answer(self, queries: Sequence[Query], deadline: float, context: object = None) -> list[Answer]:
        """Queue every text of one request and wait for all, or raise by the deadline.

        The caller has admitted the whole request (admission.py), so it is never half queued. On
        timeout or cancellation (the client left) the futures are cancelled, and neither the batch
        loop nor the inference thread spends anything more on them.
        """
        futures = [self.enqueue(query, deadline, context) for query in queries]
        try:
            async with asyncio.timeout_at(deadline):
                return list(await asyncio.gather(*futures))
        except TimeoutError:
            raise DeadlineExceeded("the request did not finish within its deadline") from None
        finally:
            for future in futures:
                future.cancel()  # no-op on finished ones; frees the others' queue slots

    def close(self) -> None:
        """Stop intake (every model's: they share the thread): admission refuses every later
        request as shutting down."""
        self.scheduler.close()

    def fail_pending(self, error: Exception) -> int:
        """Answer everything this model has queued with ``error``; returns how many were waiting."""
        failed = 0
        while self._queue:
            item = self._queue.pop()
            if not item.future.done():
                item.future.set_exception(error)
                failed += 1
        return failed

    async def drain(self, budget: float) -> bool:
        """After :meth:`close`, wait up to ``budget`` seconds for the queues and the batch in flight."""
        return await self.scheduler.drain(budget)

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
            outcome = await loop.run_in_executor(self.executor, OnePass(functools.partial(self._infer, items)))
            for item in items:
                item.future.cancel()
            if number > 0:
                self.cost.observe(outcome.report(items, failed=0, number=0))
        self.cost.forward.anchor()
        self.cost.post.anchor()
        self.forecast.calibrate()
        return time.perf_counter() - started

    # -- the batch loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """The batch loop of this batcher's scheduler (one model's own, when it made it): until cancelled."""
        await self.scheduler.run()

    async def wait_for_company(self, loop: asyncio.AbstractEventLoop, alone: Callable[[], bool] = lambda: True) -> None:
        """With ``max_batch_delay``, wait until the oldest item's single deadline or a full batch,
        or until ``alone()`` turns false (another model's work arrived: the thread must not idle).

        The window is counted once from the oldest waiting item (never restarted per arrival),
        and skipped entirely when the delay is 0.
        """
        delay = self.settings.max_batch_delay
        if delay <= 0 or not self._queue:
            return
        close_at = self._queue.oldest.enqueued_at + delay
        arrived = self.scheduler.arrived
        while len(self._queue) < self.settings.max_batch_size and not self.closed and alone():
            remaining = close_at - loop.time()
            if remaining <= 0:
                return
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), remaining)
            except TimeoutError:
                return

    def _sweep(self, now: float) -> None:
        """Drop items at the head that need no forward pass: done, expired, or sure to expire.

        A future is already done when its client left (handler cancelled) or the view's own
        deadline fired. An item whose deadline will pass before even a batch of one could finish
        is answered 504 now instead of costing a forward pass it cannot use.
        """
        while self._queue:
            item = self._queue.oldest
            if item.future.done():
                self._queue.pop()
                self._count_drop(item, now)
            elif now + self.forecast.seconds_for(item.work) >= item.deadline:
                self._queue.pop()
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
        for item in self._queue.discard_done():
            self._count_drop(item, now)

    def next_batch(self, now: float) -> list[WorkItem]:
        """This model's next batch, packed by length, always holding the oldest live item.

        The one place that decides what of this model's queue runs next (the scheduler decides
        which model runs).
        """
        self._sweep(now)
        window = self._queue.window(PACKING_WINDOW_BATCHES * self.settings.max_batch_size)
        if not window:
            return []
        chosen = choose_batch(
            [item.n_tokens for item in window],
            max_batch_size=self.settings.max_batch_size,
            max_batch_tokens=self.settings.max_batch_tokens,
            batch_overhead_tokens=self._batch_overhead_tokens(),
        )
        batch = [window[i] for i in chosen]
        self._queue.remove(batch)
        return batch

    def _batch_overhead_tokens(self) -> float:
        """The fixed cost of a forward pass, in tokens of compute: what a split must save."""
        fixed, per_token = self.cost.coefficients()
        if per_token > 0:
            return fixed / per_token
        # Unmeasured: assume a pass costs 32 tokens. Measured without a slope: never split.
        return float("inf") if fixed > 0 else 32.0

    async def run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> float:
        """Run ``batch`` on the inference thread and resolve its futures; returns the seconds it held the thread."""
        padded = padded_cost([item.n_tokens for item in batch])
        started, started_ns = loop.time(), time.time_ns()
        predicted = self.cost.predict(padded) + self.cost.post_processing(Work.of([item.query for item in batch]))
        scheduler = self.scheduler
        scheduler.in_flight = InFlight(lane=self, started=time.monotonic(), predicted_s=predicted)
        try:
            outcome = await loop.run_in_executor(self.executor, OnePass(functools.partial(self._infer, batch)))
        except Exception:  # a bug in the isolation itself: fail this batch only, keep serving
            log.exception("batch of %d failed outside the model", len(batch))
            failure: list[TextAnswer | Exception | None] = [InferenceFailed("inference failed")] * len(batch)
            outcome = Outcome(failure, loop.time() - started, None, Work())
        finally:
            scheduler.in_flight = None
        scheduler.batches_run += 1
        number = scheduler.batches_run
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
        report = outcome.report(batch, failed, number, started_ns)
        for listener in self.listeners:
            try:
                listener(report)
            except Exception:  # an observer's bug (metrics, tracing) must not stop the batch loop
                log.exception("a batch listener failed")
        return outcome.seconds

    def _infer(self, batch: Sequence[WorkItem]) -> Outcome:
        """On the inference thread: the batch's whole job, with the heartbeat refreshed around it."""
        self.scheduler.last_progress = time.monotonic()
        outcome = infer(self.model, batch)
        self.scheduler.last_progress = time.monotonic()
        self.forecast.observe_pass(outcome.seconds)
        return outcome
