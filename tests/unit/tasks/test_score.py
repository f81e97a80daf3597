"""The scoring task: one masked copy per scored token, and the copies' answers summed per text."""

from __future__ import annotations

import math

import pytest

from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.errors import InvalidInput
from maskserve.model_api import text_answer_json
from maskserve.serving.work_queue import Answer
from maskserve.tasks.score import Score
from maskserve.tasks.score_request import ScoreRequest, ScoreRequestParser

TASK = Score(ScoreRequestParser(Settings()))
TEXTS = ("paris is the capital of france.", "a cat sat.")


def test_a_plan_has_one_copy_per_scored_token_each_with_its_own_mask(bert_engine: FillMaskEngine) -> None:
    plan = TASK.plan(ScoreRequest(texts=TEXTS, batched=True), bert_engine)
    assert [len(text.copies) for text in plan.per_text] == [len(bert_engine.encode(t)) - 2 for t in TEXTS]
    assert plan.queries == plan.per_text[0].copies + plan.per_text[1].copies
    assert plan.windows == (1, 1)
    for text in plan.per_text:
        copies = text.copies
        positions = [copy.input_ids.index(bert_engine.mask_token_id) for copy in copies]
        assert positions == list(range(1, len(copies) + 1))  # every token but the two special ones
    assert TASK.decodes(plan) == 0


def test_a_fold_sums_each_texts_log_probabilities(bert_engine: FillMaskEngine) -> None:
    plan = TASK.plan(ScoreRequest(texts=TEXTS, batched=True), bert_engine)
    predictions = bert_engine.predict(plan.queries)
    answers = [Answer(p, 0.0, 0.0, 1, json=text_answer_json(p)) for p in predictions]
    scores = TASK.fold(plan, answers, bert_engine)
    start = 0
    for text, score in zip(plan.per_text, scores, strict=True):
        copies = text.copies
        own = predictions[start : start + len(copies)]
        start += len(copies)
        expected = [math.log(answer[0][0]["score"]) for answer in own]
        assert [token["score"] for token in score.tokens] == pytest.approx(expected)
        assert score.score == pytest.approx(math.fsum(expected))


def test_a_text_of_several_is_named_as_the_request_asks(bert_engine: FillMaskEngine) -> None:
    for element, named in (("inputs[{index}]", "inputs[1]"), ("sentence {number}", "sentence 2")):
        with pytest.raises(InvalidInput, match=named.replace("[", r"\[")):
            TASK.plan(ScoreRequest(texts=("fine.", "  "), batched=True, element=element), bert_engine)
