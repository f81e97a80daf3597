"""The fill-mask task: a request's rows (each text's query, then its whole-word copies), and the rows'
answers folded back into one answer per text."""

from __future__ import annotations

from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.model_api import text_answer_json
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask import FillMask, FillMaskPlan
from maskserve.tasks.fill_mask_request import FillMaskRequest, RequestParser
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, holding, leave_once_queued
from tests.models import LONG_TEXT

TASK = FillMask(RequestParser(Settings()))
TEXTS = ("the [MASK] is the [MASK] of france.", "paris is a [MASK].")
WORDS = ("city", "cats", "new city")  # "new city" is two tokens: a whole word


def request(targets: tuple[str, ...] | None) -> FillMaskRequest:
    return FillMaskRequest(texts=TEXTS, batched=True, top_k=3, targets=targets)


def answered(plan: FillMaskPlan, engine: FillMaskEngine) -> list[Answer]:
    """The engine's answers to the plan's rows, each served a little later than the one before."""
    predictions = engine.predict(plan.queries)
    return [
        Answer(predictions=p, queued_s=0.1 * i, inference_s=0.01 * i, batch_size=i + 1, json=text_answer_json(p))
        for i, p in enumerate(predictions)
    ]


def test_a_plan_queues_each_texts_own_query_then_the_copies_of_its_whole_words(
    wordpiece_engine: FillMaskEngine,
) -> None:
    plan = TASK.plan(request(WORDS), wordpiece_engine)
    assert len(plan.texts) == 2 and all(text.has_words for text in plan.texts)
    assert plan.queries == plan.texts[0].queries + plan.texts[1].queries
    for text in plan.texts:
        assert text.queries[0] == text.query and len(text.queries) > 1  # its own, then the copies
    assert TASK.decodes(plan) > 0  # whole words are decoded into the answers


def test_without_whole_words_a_plan_is_one_query_a_text_and_folds_to_its_answers(
    wordpiece_engine: FillMaskEngine,
) -> None:
    plan = TASK.plan(request(None), wordpiece_engine)
    assert len(plan.queries) == len(TEXTS) and TASK.decodes(plan) == 0
    answers = answered(plan, wordpiece_engine)
    assert TASK.fold(plan, answers, wordpiece_engine) == answers


def test_a_fold_gives_each_text_one_answer_served_as_its_slowest_row(wordpiece_engine: FillMaskEngine) -> None:
    plan = TASK.plan(request(WORDS), wordpiece_engine)
    answers = answered(plan, wordpiece_engine)
    folded = TASK.fold(plan, answers, wordpiece_engine)
    assert len(folded) == len(TEXTS)
    start = 0
    for text, answer in zip(plan.texts, folded, strict=True):
        rows = answers[start : start + len(text.queries)]
        start += len(text.queries)
        assert answer.queued_s == max(row.queued_s for row in rows)
        assert answer.batch_size == max(row.batch_size for row in rows)
        assert answer.json == text_answer_json(answer.predictions)
        # Per mask, top_k candidates among the single tokens and the whole words, the word among them.
        assert len(answer.predictions) == text.query.n_masks
        assert all(len(mask) == 3 for mask in answer.predictions)
    first_masks = folded[0].predictions
    assert any(p["token_str"] == "new city" for mask in first_masks for p in mask)


def test_a_long_text_plans_its_windows_and_folds_them_into_one_answer(bert_engine: FillMaskEngine) -> None:
    task = FillMask(RequestParser(Settings()))
    plan = task.plan(
        FillMaskRequest(texts=(LONG_TEXT, "a [MASK] b."), batched=True, top_k=2, targets=None), bert_engine
    )
    assert plan.windows == (2, 1) and len(plan.queries) == 3
    # Each window's predictions decode the whole text: the fold's work, off the event loop.
    assert task.decodes(plan) == 2 * 2 * plan.texts[0].query.n_tokens
    predictions = bert_engine.predict(plan.queries)
    answers = [Answer(p, 0.01 * i, 0.0, 3, json=text_answer_json(p)) for i, p in enumerate(predictions)]
    long, short = task.fold(plan, answers, bert_engine)
    assert short is answers[2]
    assert [[p["token"] for p in mask] for mask in long.predictions] == [
        [p["token"] for p in window[0]] for window in predictions[:2]
    ]
    whole = plan.texts[0].query.input_ids
    first = long.predictions[0][0]
    assert (
        first["sequence"] == bert_engine.fill_word(whole, whole.index(bert_engine.mask_token_id), (first["token"],))[1]
    )
    assert long.queued_s == 0.01 and long.json == text_answer_json(long.predictions)


async def test_an_abandoned_long_text_costs_no_forward_pass(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model)
    batcher = default_parts(client).batcher
    async with holding(client, model, first="a [MASK] b.") as held:
        await leave_once_queued(client, "/", 2, data=LONG_TEXT)  # its two windows
    assert (await held.busy).status == 200
    assert (await client.post("/", data="a [MASK] b.")).status == 200
    assert batcher.drops.abandoned == 2
    assert sum(len(batch) for batch in model.batches) == 2
