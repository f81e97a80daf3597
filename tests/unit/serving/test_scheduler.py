"""The one inference thread shared by several models: fair by measured seconds, never idle while
any model has work, one model per batch. Driven without HTTP, on a real thread."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from maskserve.config.settings import Settings
from maskserve.model_api import Query
from maskserve.serving.batcher import Batcher
from maskserve.serving.costs import BatchReport, Work
from maskserve.serving.scheduler import Scheduler
from tests.fakes import Costs, EchoModel


class Lanes:
    """Named batchers on one scheduler, and the order their batches ran in."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.by_name: dict[str, Batcher] = {}
        self.order: list[str] = []

    def add(self, name: str, model: EchoModel, **limits: int) -> Batcher:
        batcher = Batcher(
            model,
            self.scheduler.executor,
            Settings(**limits),
            scheduler=self.scheduler,
            name=name,  # type: ignore[arg-type]
        )

        def record(report: BatchReport) -> None:
            self.order.append(name)

        batcher.listeners.append(record)
        self.by_name[name] = batcher
        return batcher


@contextlib.asynccontextmanager
async def shared_thread() -> AsyncIterator[Lanes]:
    executor = ThreadPoolExecutor(max_workers=1)
    scheduler = Scheduler(executor)
    lanes = Lanes(scheduler)
    task = asyncio.create_task(scheduler.run())
    try:
        yield lanes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        executor.shutdown(wait=True)


def text(n: int = 3) -> Query:
    return Query(input_ids=(101, *([1004] * (n - 3)), 4, 102), top_k=1)


def deadline() -> float:
    return asyncio.get_running_loop().time() + 60.0


async def test_a_quiet_model_waits_for_at_most_the_pass_in_flight_while_another_is_flooded() -> None:
    async with shared_thread() as lanes:
        flooded = lanes.add("flooded", EchoModel(Costs(per_pass=0.01)), max_batch_size=2, max_queue=400)
        quiet = lanes.add("quiet", EchoModel(Costs(per_pass=0.01)))
        flood = [flooded.enqueue(text(), deadline()) for _ in range(200)]
        while len(lanes.order) < 5:  # the flood is running
            await asyncio.sleep(0.005)
        for _ in range(5):
            before = len(lanes.order)
            await quiet.answer([text()], deadline())
            # Its own batch came at most one flooded pass (the one in flight) after it arrived.
            assert lanes.order[before:].index("quiet") <= 1
        for future in flood:
            future.cancel()


async def test_two_flooded_models_of_equal_cost_share_the_thread_evenly() -> None:
    async with shared_thread() as lanes:
        a = lanes.add("a", EchoModel(Costs(per_pass=0.005)), max_batch_size=1, max_queue=100)
        b = lanes.add("b", EchoModel(Costs(per_pass=0.005)), max_batch_size=1, max_queue=100)
        await asyncio.gather(
            *(a.enqueue(text(), deadline()) for _ in range(40)), *(b.enqueue(text(), deadline()) for _ in range(40))
        )
        first = lanes.order[:40]
        assert abs(first.count("a") - first.count("b")) <= 4, first
        assert lanes.order.count("a") == lanes.order.count("b") == 40


async def test_the_share_is_of_seconds_not_of_batches() -> None:
    async with shared_thread() as lanes:
        slow = lanes.add("slow", EchoModel(Costs(per_pass=0.02)), max_batch_size=1, max_queue=100)
        fast = lanes.add("fast", EchoModel(Costs(per_pass=0.005)), max_batch_size=1, max_queue=100)
        slow_futures = [slow.enqueue(text(), deadline()) for _ in range(30)]
        fast_futures = [fast.enqueue(text(), deadline()) for _ in range(100)]
        while len(lanes.order) < 40:
            await asyncio.sleep(0.01)
        window = lanes.order[5:40]
        # A slow pass costs four fast ones: the fast model runs several batches for each slow one.
        assert window.count("fast") >= 2 * window.count("slow") > 0, window
        for future in slow_futures + fast_futures:
            future.cancel()


async def test_an_idle_model_saves_no_credit_for_later() -> None:
    async with shared_thread() as lanes:
        a = lanes.add("a", EchoModel(Costs(per_pass=0.005)), max_batch_size=1, max_queue=200)
        b = lanes.add("b", EchoModel(Costs(per_pass=0.005)), max_batch_size=1, max_queue=200)
        await asyncio.gather(*(a.enqueue(text(), deadline()) for _ in range(30)))  # b idle meanwhile
        started = len(lanes.order)
        futures = [a.enqueue(text(), deadline()) for _ in range(30)] + [
            b.enqueue(text(), deadline()) for _ in range(30)
        ]
        while len(lanes.order) < started + 20:
            await asyncio.sleep(0.005)
        after = lanes.order[started : started + 20]
        # b joins at a's account, not at zero: it does not get the thread alone for 30 passes.
        assert after.count("a") >= 6, after
        await asyncio.gather(*futures)


async def test_no_batch_mixes_models_and_every_text_gets_its_own_models_answer() -> None:
    async with shared_thread() as lanes:
        one = lanes.add("one", EchoModel(word="one"))
        two = lanes.add("two", EchoModel(word="two"))
        answers = await asyncio.gather(
            *(one.answer([text(3 + i % 5)], deadline()) for i in range(30)),
            *(two.answer([text(3 + i % 5)], deadline()) for i in range(30)),
        )
        words = [answer[0].predictions[0][0]["token_str"] for answer in answers]
        assert words == ["one"] * 30 + ["two"] * 30
        assert lanes.scheduler.batches_run == len(lanes.order)


async def test_a_batch_window_never_idles_the_thread_while_another_model_waits() -> None:
    async with shared_thread() as lanes:
        patient = lanes.add("patient", EchoModel(), max_batch_delay=5)  # type: ignore[arg-type]
        other = lanes.add("other", EchoModel())
        waiting = patient.enqueue(text(), deadline())
        await asyncio.sleep(0.05)  # patient's window is open, for up to 5 s
        loop = asyncio.get_running_loop()
        started = loop.time()
        await other.answer([text()], deadline())
        assert loop.time() - started < 2.5  # answered without waiting out the window
        waiting.cancel()


async def test_the_predicted_wait_counts_the_other_models_fair_share() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    lanes = Lanes(Scheduler(executor))
    a = lanes.add("a", EchoModel(), max_queue=100)
    b = lanes.add("b", EchoModel(), max_queue=100)
    for lane in (a, b):  # one second a text, whatever the batch
        lane.forecast.seconds_for = lambda work: float(work.texts)  # type: ignore[method-assign]
    for _ in range(10):
        b.enqueue(text(), deadline())
    alone = Work(texts=2)
    # a's 2 s of work drains while b gets as much (2 s of its 10): 4 s; b's own wait adds a's 0.
    assert a.predicted_wait(alone) == 4.0
    assert b.predicted_wait() == 10.0
    for _ in range(3):
        a.enqueue(text(), deadline())
    assert b.predicted_wait() == 10.0 + 3.0
    executor.shutdown()
