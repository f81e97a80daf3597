"""work_queue.py: a WorkItem knows whether anyone still waits for it, ``slowest`` times a request by
its slowest text, and a WorkQueue keeps its items oldest first and their total Work as they come and go."""

from __future__ import annotations

import asyncio
import time

from maskserve.model_api import Query
from maskserve.serving.costs import Work
from maskserve.serving.work_queue import Answer, Timing, WorkItem, WorkQueue, slowest


def item(tokens: int = 3, *, top_k: int = 1, seconds: float = 30.0) -> WorkItem:
    """A text of ``tokens`` tokens waiting for the model, due in ``seconds``."""
    now = time.monotonic()
    future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    return WorkItem(Query(input_ids=(101,) + (1000,) * (tokens - 2) + (102,), top_k=top_k), future, now, now + seconds)


def answer(queued_s: float, inference_s: float, batch_size: int) -> Answer:
    return Answer(predictions=[], queued_s=queued_s, inference_s=inference_s, batch_size=batch_size)


def test_a_requests_timing_is_the_largest_of_each_figure() -> None:
    answers = [answer(0.5, 0.1, 4), answer(0.2, 0.3, 8), answer(0.1, 0.2, 2)]
    assert slowest(answers) == Timing(queued_s=0.5, inference_s=0.3, batch_size=8)


async def test_an_item_is_wanted_until_its_future_is_done() -> None:
    waiting = item()
    assert waiting.wanted()
    waiting.future.cancel()  # the client left
    assert not waiting.wanted()


async def test_an_item_past_its_deadline_is_not_wanted() -> None:
    assert not item(seconds=-0.001).wanted()


async def test_an_items_work_is_its_querys() -> None:
    waiting = item(tokens=5, top_k=3)
    assert waiting.n_tokens == 5
    assert waiting.work == Work(texts=1, tokens=5, predictions=3, prediction_tokens=15)


async def test_the_queue_pops_oldest_first_and_keeps_its_work() -> None:
    queue = WorkQueue()
    first, second = item(3), item(7)
    queue.append(first)
    queue.append(second)
    assert len(queue) == 2 and queue.oldest is first and list(queue) == [first, second]
    assert queue.work == first.work + second.work
    assert queue.pop() is first
    assert queue.work == second.work
    assert queue.pop() is second
    assert queue.work == Work() and len(queue) == 0


async def test_discard_done_removes_finished_items_wherever_they_wait() -> None:
    queue = WorkQueue()
    items = [item(n + 3) for n in range(4)]
    for waiting in items:
        queue.append(waiting)
    items[1].future.cancel()
    items[3].future.set_exception(TimeoutError())
    assert queue.discard_done() == [items[1], items[3]]
    assert list(queue) == [items[0], items[2]]
    assert queue.work == items[0].work + items[2].work
    items[3].future.exception()  # retrieved: asyncio would warn of an exception never read


async def test_window_skips_done_items_and_stops_at_its_size() -> None:
    queue = WorkQueue()
    items = [item() for _ in range(5)]
    for waiting in items:
        queue.append(waiting)
    items[0].future.cancel()
    assert queue.window(2) == [items[1], items[2]]
    assert queue.window(10) == items[1:]
    assert len(queue) == 5  # a window takes nothing out


async def test_remove_takes_a_batch_out_from_anywhere_and_its_work_with_it() -> None:
    queue = WorkQueue()
    items = [item(n + 3) for n in range(4)]
    for waiting in items:
        queue.append(waiting)
    queue.remove([items[2], items[0]])
    assert list(queue) == [items[1], items[3]]
    assert queue.work == items[1].work + items[3].work


async def test_items_with_equal_queries_are_still_told_apart() -> None:
    queue = WorkQueue()
    twins = [item(), item()]
    assert twins[0].query == twins[1].query and twins[0] != twins[1]
    for waiting in twins:
        queue.append(waiting)
    queue.remove([twins[1]])
    assert list(queue) == [twins[0]]
