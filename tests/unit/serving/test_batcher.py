"""The batcher driven without HTTP: a real event loop, a real inference thread, a controlled model."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.errors import DeadlineExceeded, InferenceFailed, ShuttingDown
from maskserve.model_api import Query
from maskserve.serving.batcher import Batcher
from maskserve.serving.costs import BatchReport, CostModel, LinearCost, Work
from maskserve.serving.inference import predict_isolating
from tests.fakes import ControlledModel, EchoModel, wait_for_depth, wait_until_entered


def query(text: str, model: EchoModel | ControlledModel | None = None) -> Query:
    return Query(input_ids=(model or EchoModel()).encode(text), top_k=1)


@contextlib.asynccontextmanager
async def running(model: ControlledModel, **limits: float) -> AsyncIterator[Batcher]:
    executor = ThreadPoolExecutor(max_workers=1)
    batcher = Batcher(model, executor, Settings(**limits))  # type: ignore[arg-type]
    task = asyncio.create_task(batcher.run())
    try:
        yield batcher
    finally:
        model.release()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        executor.shutdown(wait=True)


def later(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_idle_model_starts_a_lone_request_at_once() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5)))
        await wait_until_entered(model)  # it started alone: nobody waited for company
        second = asyncio.create_task(batcher.answer([query("b b [MASK]")], later(5)))
        await wait_for_depth(batcher, 1)
        model.release()
        await asyncio.gather(first, second)
    assert model.batch_sizes() == [1, 1]


async def test_requests_arriving_while_the_model_is_busy_run_together() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5)))
        await wait_until_entered(model)
        texts = [f"w{n} [MASK]" for n in range(1, 6)]
        rest = [asyncio.create_task(batcher.answer([query(t)], later(5))) for t in texts]
        await wait_for_depth(batcher, 5)
        model.release()
        answers = await asyncio.gather(first, *rest)
    assert model.batch_sizes() == [1, 5]
    # Each caller got the answer to its own text.
    for text, (answer,) in zip(["a [MASK]", *texts], answers):
        assert answer.predictions[0][0]["token"] == sum(EchoModel().encode(text))
    assert answers[1][0].batch_size == 5


async def test_batch_size_and_token_budget_bound_each_batch() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model, max_batch_size=3, max_batch_tokens=40) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5)))
        await wait_until_entered(model)
        short = [asyncio.create_task(batcher.answer([query("x [MASK]")], later(5))) for _ in range(7)]
        long = asyncio.create_task(batcher.answer([query("w " * 30 + "[MASK]")], later(5)))
        await wait_for_depth(batcher, 8)
        model.release()
        await asyncio.gather(first, *short, long)
    assert all(size <= 3 for size in model.batch_sizes())
    for batch in model.batches:
        assert len(batch) == 1 or len(batch) * max(len(ids) for ids in batch) <= 40
    assert sum(model.batch_sizes()) == 9


async def test_batch_delay_is_one_deadline_from_the_oldest_request_not_restarted_per_arrival() -> None:
    model = ControlledModel()
    async with running(model, max_batch_delay=0.3, max_batch_size=64) as batcher:
        tasks = []
        for _ in range(12):  # one arrival every 0.1 s for 1.2 s: a per-fetch timer never fires
            tasks.append(asyncio.create_task(batcher.answer([query("a [MASK]")], later(10))))
            await asyncio.sleep(0.1)
        await asyncio.gather(*tasks)
    assert len(model.batches) >= 3, model.batch_sizes()
    assert max(model.batch_sizes()) < 12


async def test_expired_request_is_answered_504_and_never_reaches_the_model() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5)))
        await wait_until_entered(model)
        with pytest.raises(DeadlineExceeded):
            await batcher.answer([query("late late [MASK]")], later(0.05))
        model.release()
        await first
        await batcher.answer([query("after [MASK]")], later(5))
    assert EchoModel().encode("late late [MASK]") not in [ids for batch in model.batches for ids in batch]
    assert batcher.drops.expired == 1


async def test_request_sure_to_miss_its_deadline_is_dropped_before_inference() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        # Measured: every pass takes 10 s, so a text with 1 s left cannot make it.
        batcher.cost.observe(BatchReport(size=1, real_tokens=3, padded_tokens=3, seconds=10.0, failed=0))
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(60)))
        await wait_until_entered(model)
        doomed = asyncio.create_task(batcher.answer([query("doomed doomed [MASK]")], later(1.0)))
        await wait_for_depth(batcher, 1)
        model.release()
        await first
        with pytest.raises(DeadlineExceeded):
            await doomed
    assert model.batch_sizes() == [1]
    assert batcher.drops.expired == 1


async def test_abandoned_requests_are_dropped_before_the_next_batch() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5)))
        await wait_until_entered(model)
        leaving = [asyncio.create_task(batcher.answer([query("gone [MASK]")], later(5))) for _ in range(5)]
        staying = asyncio.create_task(batcher.answer([query("stay here [MASK]")], later(5)))
        await wait_for_depth(batcher, 6)
        for task in leaving:
            task.cancel()  # what aiohttp does to a handler whose client disconnected
        await asyncio.gather(*leaving, return_exceptions=True)
        model.release()
        await asyncio.gather(first, staying)
    assert model.batches == [[EchoModel().encode("a [MASK]")], [EchoModel().encode("stay here [MASK]")]]
    assert batcher.drops.abandoned == 5


async def test_poisoned_input_fails_alone_and_its_neighbours_get_answers() -> None:
    model = ControlledModel()
    poison = query("poison [MASK]")
    model.poisoned.add(poison.input_ids)
    model.hold()
    async with running(model) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5)))
        await wait_until_entered(model)
        texts = ["one [MASK]", "poison [MASK]", "three three [MASK]", "four four four [MASK]"]
        tasks = [asyncio.create_task(batcher.answer([query(t)], later(5))) for t in texts]
        await wait_for_depth(batcher, 4)
        model.release()
        await first
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[1], InferenceFailed)
    assert "poison" not in results[1].message
    for index in (0, 2, 3):
        assert not isinstance(results[index], BaseException)


async def test_model_failing_everything_fails_each_request_cleanly_and_recovers() -> None:
    model = ControlledModel()
    model.fail_all = True
    async with running(model) as batcher:
        results = await asyncio.gather(
            *(batcher.answer([query(f"{'w ' * n}[MASK]")], later(5)) for n in range(4)), return_exceptions=True
        )
        assert all(isinstance(r, InferenceFailed) for r in results)
        model.fail_all = False
        (answer,) = await batcher.answer([query("fine [MASK]")], later(5))
    assert answer.predictions[0][0]["token"] == sum(EchoModel().encode("fine [MASK]"))


def test_isolation_bisects_down_to_the_failing_input() -> None:
    model = ControlledModel()
    queries = [query(f"{'w ' * n}[MASK]") for n in range(8)]
    model.poisoned.add(queries[5].input_ids)
    outcomes = predict_isolating(model, queries)
    assert [isinstance(o, Exception) for o in outcomes] == [i == 5 for i in range(8)]
    assert len(model.batches) < 2 * 8  # bisection, not one retry per input after every failure


async def test_closed_batcher_drains_what_it_accepted() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        accepted = [asyncio.create_task(batcher.answer([query(f"t{n} [MASK]")], later(5))) for n in range(3)]
        await wait_until_entered(model)
        batcher.close()
        assert batcher.closed  # admission refuses from here on (test_admission.py)
        model.release()
        assert await batcher.drain(5)
        results = await asyncio.gather(*accepted)
    assert len(results) == 3


async def test_fail_pending_answers_everything_still_queued() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5)))
        await wait_until_entered(model)
        waiting = [asyncio.create_task(batcher.answer([query("b [MASK]")], later(5))) for _ in range(3)]
        await wait_for_depth(batcher, 3)
        batcher.close()
        assert not await batcher.drain(0.05)
        assert batcher.fail_pending(ShuttingDown("stopping")) == 3
        results = await asyncio.gather(*waiting, return_exceptions=True)
        model.release()
        await first
    assert all(isinstance(r, ShuttingDown) for r in results)


def test_cost_model_learns_fixed_and_per_token_cost() -> None:
    cost = CostModel()
    assert cost.predict(1000) == 0.0  # never refuse on a guess
    cost.observe(BatchReport(size=1, real_tokens=100, padded_tokens=100, seconds=0.02, failed=0))
    assert cost.coefficients() == pytest.approx((0.02, 0.0))  # one size seen: no slope, all per pass
    for padded in (100, 400, 800, 200, 600, 300, 700, 500) * 20:
        cost.observe(
            BatchReport(size=4, real_tokens=padded, padded_tokens=padded, seconds=0.01 + padded * 1e-4, failed=0)
        )
    fixed, per_token = cost.coefficients()
    assert fixed == pytest.approx(0.01, rel=1e-3)
    assert per_token == pytest.approx(1e-4, rel=1e-3)
    assert cost.predict(1000, batches=2) == pytest.approx(0.02 + 0.1, rel=1e-3)


async def test_predicted_wait_grows_with_the_queue() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model) as batcher:
        batcher.cost.observe(BatchReport(size=1, real_tokens=10, padded_tokens=10, seconds=0.5, failed=0))
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(30)))
        await wait_until_entered(model)
        empty = batcher.predicted_wait()
        tasks = [asyncio.create_task(batcher.answer([query("b b b [MASK]")], later(30))) for _ in range(10)]
        await wait_for_depth(batcher, 10)
        assert batcher.predicted_wait() > empty
        model.release()
        await asyncio.gather(first, *tasks)


async def test_slots_of_abandoned_requests_are_freed_while_a_pass_hangs() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model, max_queue=3) as batcher:
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(30)))
        await wait_until_entered(model)
        gone = [asyncio.create_task(batcher.answer([query("gone [MASK]")], later(30))) for _ in range(3)]
        await wait_for_depth(batcher, 3)
        assert batcher.is_full()
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        # The pass is still held, yet the cancelled texts no longer count against the bound.
        assert not batcher.is_full()
        assert batcher.drops.abandoned == 3
        model.release()
        await first


async def test_a_failing_listener_never_stops_the_batch_loop(caplog: pytest.LogCaptureFixture) -> None:
    def broken(report: BatchReport) -> None:
        raise RuntimeError("an observer's bug")

    async with running(ControlledModel()) as batcher:
        batcher.listeners.insert(0, broken)
        first = await batcher.answer([query("a [MASK]")], later(5))
        second = await batcher.answer([query("b [MASK]")], later(5))
        assert (first[0].batch_number, second[0].batch_number) == (1, 2)
    assert "a batch listener failed" in caplog.text


async def test_a_report_names_each_requests_context_once_and_the_answers_their_pass() -> None:
    reports: list[BatchReport] = []
    model = ControlledModel()
    async with running(model) as batcher:
        batcher.listeners.append(reports.append)
        model.hold()
        first = asyncio.create_task(batcher.answer([query("a [MASK]")], later(5), context="first"))
        await wait_until_entered(model)
        shared = [query("b [MASK]"), query("c [MASK]")]
        both = asyncio.create_task(batcher.answer(shared, later(5), context=["unhashable"]))
        other = asyncio.create_task(batcher.answer([query("d [MASK]")], later(5)))
        await wait_for_depth(batcher, 3)
        model.release()
        answers = [await first, await both, await other]
    assert [r.contexts for r in reports] == [("first",), (["unhashable"],)]
    assert [r.number for r in reports] == [1, 2]
    assert reports[1].started_ns >= reports[0].started_ns > 0
    assert [a.batch_number for request in answers for a in request] == [1, 2, 2, 2]


async def test_texts_of_a_request_answered_504_never_reach_the_model() -> None:
    model = ControlledModel()
    model.hold()
    async with running(model, max_batch_size=2) as batcher:
        texts = [query(f"{'w ' * i}[MASK]") for i in range(6)]
        with pytest.raises(DeadlineExceeded):
            # Its first two texts start at once and are held past the deadline; four wait.
            await batcher.answer(texts, later(0.2))
        model.release()
        # The batcher is free again: a later request runs, alone.
        await batcher.answer([query("after [MASK]")], later(5))
    ran = [ids for batch in model.batches for ids in batch]
    assert ran == [texts[0].input_ids, texts[1].input_ids, query("after [MASK]").input_ids], model.batches
    assert batcher.drops.expired + batcher.drops.abandoned == 4


class Halting:
    """A Progress that stops wanting answers after ``allowed`` questions, and counts them."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.asked = 0
        self.forward = False

    def forward_done(self) -> None:
        self.forward = True

    def wanted(self, index: int) -> bool:
        self.asked += 1
        return self.asked <= self.allowed


def test_the_engine_stops_post_processing_a_text_nobody_waits_for(default_engine: FillMaskEngine) -> None:
    m = default_engine.mask_token
    text = f"{m} and {m} and {m} are words ."
    queries = [
        Query(default_engine.encode(text), top_k=5, n_masks=3),
        Query(default_engine.encode(f"a {m} ."), top_k=5),
    ]
    assert [len(r) for r in default_engine.predict(queries)] == [3, 1]
    halting = Halting(allowed=2)  # the first text's first two masks, then nobody waits
    assert default_engine.predict(queries, halting) == [[], []]
    assert halting.forward and halting.asked == 4  # asked before each mask; no decoding after a no


async def test_the_inference_thread_is_back_soon_after_a_deadline_passes_in_post_processing(
    default_engine: FillMaskEngine,
) -> None:
    m = default_engine.mask_token
    # Eight masks, each with 100 predictions that each decode about 500 tokens: most of this
    # batch's time is post-processing, which stops at the next mask once the deadline passes.
    ids = default_engine.encode(" ".join(["word"] * 490 + [m] * 8))
    costly = [Query(ids, top_k=100, n_masks=8)]
    executor = ThreadPoolExecutor(max_workers=1)
    batcher = Batcher(default_engine, executor, Settings())
    task = asyncio.create_task(batcher.run())
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await batcher.answer(costly, later(60))
        whole = loop.time() - started
        started = loop.time()
        with pytest.raises(DeadlineExceeded):
            await batcher.answer(costly, later(whole / 8))
        while batcher.scheduler.in_flight is not None:
            await asyncio.sleep(0.005)
        freed = loop.time() - started
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        executor.shutdown(wait=True)
    # Free again well before the whole batch would have run: at most a mask or two after its deadline.
    assert freed < whole * 0.6, (freed, whole)
    assert batcher.drops.expired == 1


def test_the_cost_model_fits_post_processing_apart_from_the_forward_pass() -> None:
    cost = CostModel()
    for predictions, tokens in ((5, 10), (100, 500), (40, 64), (800, 512), (10, 200)) * 10:
        post = predictions * 1e-5 + predictions * tokens * 1e-6
        cost.observe(
            BatchReport(
                size=1,
                real_tokens=tokens,
                padded_tokens=tokens,
                seconds=0.01 + post,
                forward_seconds=0.01,
                failed=0,
                predictions=predictions,
                prediction_tokens=predictions * tokens,
            )
        )
    assert cost.post.coefficients() == pytest.approx((1e-5, 1e-6), rel=1e-3)
    assert cost.coefficients() == pytest.approx((0.01, 0.0), abs=1e-6)
    work = Work(texts=1, tokens=512, predictions=800, prediction_tokens=800 * 512)
    assert cost.post_processing(work) == pytest.approx(800 * 1e-5 + 800 * 512 * 1e-6, rel=1e-3)


async def test_warm_up_measures_both_costs_before_any_request() -> None:
    model = ControlledModel()
    async with running(model) as batcher:
        assert batcher.forecast.stall_budget(1.0) == 1.0  # nothing measured: the floor
        seconds = await batcher.warm_up(top_k=20)
        assert seconds >= 0 and batcher.cost.forward.measured and batcher.cost.post.measured
        assert batcher.forecast.calibrated_longest_s > 0
        # Its passes are nobody's: no listener but the cost model heard of them.
        assert batcher.scheduler.batches_run == 0
    assert max(len(ids) for batch in model.batches for ids in batch) == EchoModel.max_tokens


def test_recent_traffic_all_alike_keeps_what_warm_up_measured_of_length() -> None:
    rng = random.Random(1)

    def real(predictions: int, tokens: float) -> float:
        return 10e-6 * predictions + 1e-6 * predictions * tokens

    cost = LinearCost()
    for predictions, tokens in ((5, 8), (40, 64), (100, 512), (200, 128)):  # warm-up: lengths far apart
        cost.observe(predictions, predictions * tokens, real(predictions, tokens))
    cost.anchor()
    for _ in range(300):  # then short sentences only, timed on a busy machine, with overheads
        predictions, tokens = rng.randint(20, 160), rng.uniform(10, 25)
        cost.observe(predictions, predictions * tokens, real(predictions, tokens) * rng.uniform(3, 8) + 0.002)
    # What the costliest request's answer costs is still known within twice...
    costly = real(2048, 512)
    assert costly / 2 <= cost.predict(2048, 2048 * 512) <= costly * 2
    # ...while the short sentences' own cost follows the busy machine.
    assert cost.predict(80, 80 * 17) > 2 * real(80, 17)
