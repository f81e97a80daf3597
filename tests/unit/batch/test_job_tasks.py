"""batch/job_tasks.py: a row through the server's own parser and task, out as the API's JSON."""

from __future__ import annotations

import math

import pytest

from maskserve.batch.job_tasks import answer_of, job_task
from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.errors import InvalidInput, NoMaskToken
from maskserve.tasks.fill_mask_request import RequestParser
from maskserve.tasks.task import Rounds


def run(name: str, text: str, parameters: dict[str, object], engine: FillMaskEngine) -> object:
    task = job_task(name, Settings())
    request, plan = task.plan(text, parameters, engine)
    predictions = engine.predict(list(plan.queries))
    answers = [answer_of(query, p, len(predictions)) for query, p in zip(plan.queries, predictions, strict=True)]
    return task.result(request, plan, answers, engine)


def test_a_fill_mask_row_answers_the_pipelines_shape_for_one_text(bert_engine: FillMaskEngine) -> None:
    one = run("fill-mask", "the [MASK] sat.", {"top_k": 2}, bert_engine)
    assert isinstance(one, list) and len(one) == 2 and set(one[0]) == {"score", "token", "token_str", "sequence"}
    two = run("fill-mask", "the [MASK] sat on the [MASK].", {}, bert_engine)
    assert isinstance(two, list) and len(two) == 2 and all(len(mask) == 5 for mask in two)


def test_a_score_row_answers_its_score_and_windows(bert_engine: FillMaskEngine) -> None:
    scored = run("score", "the cat sat.", {"tokens": True}, bert_engine)
    assert isinstance(scored, dict) and scored["windows"] == 1
    assert scored["score"] == pytest.approx(math.fsum(token["score"] for token in scored["tokens"]))


def test_a_row_the_api_refuses_is_refused_with_the_apis_error(bert_engine: FillMaskEngine) -> None:
    task = job_task("fill-mask", Settings())
    with pytest.raises(NoMaskToken):
        task.plan("no mask.", {}, bert_engine)
    with pytest.raises(InvalidInput, match="top_k"):
        task.plan("a [MASK].", {"top_k": 0}, bert_engine)
    with pytest.raises(ValueError, match="unknown task 'translate'"):
        job_task("translate", Settings())


def test_a_copy_the_server_reads_itself_is_not_encoded(bert_engine: FillMaskEngine) -> None:
    request = RequestParser(Settings()).parse_document({"inputs": "the [MASK] sat."})
    assert request.texts == ("the [MASK] sat.",)
    task = job_task("score", Settings())
    _, plan = task.plan("the cat.", {}, bert_engine)
    copy = plan.queries[0]
    assert copy.read_by_server and answer_of(copy, bert_engine.predict([copy])[0], 1).json == b""


def test_a_whole_word_row_is_planned_in_rounds_its_first_one_per_word_length(bert_engine: FillMaskEngine) -> None:
    task = job_task("fill-mask", Settings())
    _, plan = task.plan("the [MASK] sat.", {"whole_words": True, "max_word_pieces": 2}, bert_engine)
    assert isinstance(plan, Rounds)
    assert len(plan.queries) == 2 and all(query.read_by_server for query in plan.queries)
