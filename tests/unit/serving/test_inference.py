"""inference.py on the calling thread, without the batch loop: a batch's answers and their JSON, a
poisoned input failing alone, texts nobody waits for left unanswered, and the report of a pass."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from maskserve.model_api import Progress, Query, TextPredictions, text_answer_json
from maskserve.serving.costs import Work
from maskserve.serving.inference import BatchProgress, Outcome, infer, predict_isolating
from maskserve.serving.packing import padded_cost
from maskserve.serving.work_queue import Answer, TextAnswer, WorkItem
from tests.fakes import ControlledModel, EchoModel


def query(text: str, **fields: bool) -> Query:
    return Query(input_ids=EchoModel().encode(text), top_k=1, **fields)  # type: ignore[arg-type]


def item(text: str, context: object = None, **fields: bool) -> WorkItem:
    now = time.monotonic()
    future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    return WorkItem(query(text, **fields), future, now, now + 30, context)


class Recorder:
    """A batch's progress that wants every text and records which it was asked about."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.forward_passes = 0

    def forward_done(self) -> None:
        self.forward_passes += 1

    def wanted(self, index: int) -> bool:
        self.asked.append(index)
        return True


async def test_each_text_gets_its_own_answer_and_its_json() -> None:
    batch = [item("a [MASK]"), item("b bb [MASK]"), item("[MASK] c [MASK]")]
    outcome = infer(EchoModel(), batch)
    expected = EchoModel().predict([i.query for i in batch])
    assert outcome.answers == [TextAnswer(p, text_answer_json(p)) for p in expected]
    assert outcome.finished == Work.of([i.query for i in batch])
    assert outcome.forward_seconds is not None and 0 <= outcome.forward_seconds <= outcome.seconds


async def test_a_poisoned_input_fails_alone_and_its_neighbours_are_answered() -> None:
    model = ControlledModel()
    batch = [item(f"{'w ' * n}[MASK]") for n in range(5)]
    model.poisoned.add(batch[2].query.input_ids)
    outcome = infer(model, batch)
    assert isinstance(outcome.answers[2], RuntimeError)
    for n in (0, 1, 3, 4):
        answered = outcome.answers[n]
        assert isinstance(answered, TextAnswer)
        assert answered.predictions[0][0]["token"] == sum(batch[n].query.input_ids)  # its own answer
    assert outcome.finished == Work.of([batch[n].query for n in (0, 1, 3, 4)])


async def test_a_text_nobody_waits_for_is_left_unanswered_and_uncounted() -> None:
    batch = [item("a [MASK]"), item("b [MASK]")]
    batch[0].future.cancel()
    outcome = infer(EchoModel(), batch)
    assert outcome.answers[0] is None and isinstance(outcome.answers[1], TextAnswer)
    assert outcome.finished == batch[1].work


async def test_an_answer_the_server_reads_itself_gets_no_json() -> None:
    (answered,) = infer(EchoModel(), [item("a [MASK]", read_by_server=True)]).answers
    assert isinstance(answered, TextAnswer) and answered.json == b"" and answered.predictions


def test_a_lone_failing_input_is_answered_with_its_error_not_raised() -> None:
    model = ControlledModel()
    model.fail_all = True
    (result,) = predict_isolating(model, [query("a [MASK]")])
    assert isinstance(result, RuntimeError) and "every input" in str(result)


def test_after_a_split_each_half_asks_about_its_own_texts() -> None:
    model = ControlledModel()
    queries = [query(f"{'w ' * n}[MASK]") for n in range(4)]
    model.poisoned.add(queries[0].input_ids)
    progress = Recorder()
    results = predict_isolating(model, queries, progress)
    assert isinstance(results[0], Exception) and all(not isinstance(r, Exception) for r in results[1:])
    assert progress.asked == [1, 2, 3]  # never 0, and never a first half's index twice


def test_a_model_answering_another_count_is_a_bug_that_raises() -> None:
    class Short(EchoModel):
        def predict(self, queries: Sequence[Query], progress: Progress | None = None) -> list[TextPredictions]:
            return super().predict(queries, progress)[:-1]

    with pytest.raises(RuntimeError, match="returned 1 answers for 2 queries; this is a bug"):
        predict_isolating(Short(), [query("a [MASK]"), query("b [MASK]")])


async def test_batch_progress_times_only_the_first_forward_pass_and_asks_each_item() -> None:
    batch = [item("a [MASK]"), item("b [MASK]")]
    batch[1].future.cancel()
    progress = BatchProgress(batch)
    assert progress.forward_s is None
    progress.forward_done()
    first = progress.forward_s
    time.sleep(0.01)
    progress.forward_done()
    assert progress.forward_s == first
    assert progress.wanted(0) and not progress.wanted(1)


async def test_the_report_counts_the_batch_and_names_each_context_once() -> None:
    span, other = {"trace": 1}, {"trace": 1}  # equal but distinct, and unhashable
    batch = [item("a [MASK]", span), item("b b b [MASK]", span), item("c [MASK]", other), item("d [MASK]")]
    finished = Work(texts=3, predictions=3, prediction_tokens=17)
    report = Outcome([None] * 4, 0.5, 0.2, finished).report(batch, failed=1, number=7, started_ns=42)
    assert (report.size, report.failed, report.number, report.started_ns) == (4, 1, 7, 42)
    assert report.real_tokens == sum(i.n_tokens for i in batch)
    assert report.padded_tokens == padded_cost([i.n_tokens for i in batch])
    assert (report.seconds, report.forward_seconds) == (0.5, 0.2)
    assert (report.predictions, report.prediction_tokens) == (3, 17)
    assert len(report.contexts) == 2 and report.contexts[0] is span and report.contexts[1] is other
