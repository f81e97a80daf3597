"""score_request.py without HTTP: ScoreRequestParser on raw text and JSON, its metric and tokens,
its refusals naming the text at fault, and the answer's shape (text_score_json, score_response_body)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from maskserve.config.bounds import settings_from
from maskserve.config.settings import Settings
from maskserve.errors import InvalidBody, InvalidInput, TextTooLong
from maskserve.tasks.pseudo_likelihood import TextScore
from maskserve.tasks.score_request import (
    DEFAULT_METRIC,
    ScoreRequest,
    ScoreRequestParser,
    score_response_body,
    text_score_json,
)
from tests.fakes import EchoModel

PARSER = ScoreRequestParser(Settings())
JSON = "application/json"


def parse_json(document: Any, parser: ScoreRequestParser = PARSER) -> ScoreRequest:
    return parser.parse(json.dumps(document).encode(), JSON)


def test_a_raw_text_body_is_one_text_scored_by_default() -> None:
    parsed = PARSER.parse(b"Paris is big.", "text/plain")
    assert parsed == ScoreRequest(texts=("Paris is big.",), batched=False)
    assert parsed.metric == DEFAULT_METRIC == "original" and not parsed.tokens


def test_a_json_body_sent_as_text_is_scored_as_its_text() -> None:
    body = '{"inputs": "a b"}'
    assert PARSER.parse(body.encode(), "text/plain").texts == (body,)


def test_json_content_type_is_matched_whatever_its_case() -> None:
    assert PARSER.parse(b'{"inputs": "a b"}', "Application/JSON").texts == ("a b",)


def test_a_json_string_is_one_text_and_a_list_is_a_batch() -> None:
    assert parse_json({"inputs": "a b"}) == ScoreRequest(texts=("a b",), batched=False)
    assert parse_json({"inputs": ["a b"]}) == ScoreRequest(texts=("a b",), batched=True)
    assert parse_json({"inputs": ["a", "b c"]}).texts == ("a", "b c")


def test_metric_and_tokens_are_read_from_the_parameters() -> None:
    parsed = parse_json({"inputs": "a b", "parameters": {"metric": "within_word_l2r", "tokens": True}})
    assert parsed.metric == "within_word_l2r" and parsed.tokens


def test_null_parameters_take_the_defaults() -> None:
    parsed = parse_json({"inputs": "a b", "parameters": {"metric": None, "tokens": None}})
    assert parsed.metric == DEFAULT_METRIC and not parsed.tokens
    assert parse_json({"inputs": "a b", "parameters": None}).metric == DEFAULT_METRIC


@pytest.mark.parametrize(
    ("document", "field", "message"),
    [
        (
            {"inputs": "a", "parameters": {"metric": "perplexity"}},
            "parameters.metric",
            "must be one of original, within_word_l2r",
        ),
        ({"inputs": "a", "parameters": {"top_k": 3}}, "parameters", 'unknown field "top_k"'),
        ({"inputs": "a", "parameters": {"tokens": "yes"}}, "parameters.tokens", "must be true or false or null"),
        ({"text": "a"}, "inputs", '"inputs"'),
        ({"inputs": ["a"] * 65}, "inputs", "more than 64"),
    ],
)
def test_a_bad_json_body_is_refused_naming_the_field(document: Any, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_json(document)
    assert refused.value.field == field and message in refused.value.message


@pytest.mark.parametrize(("body", "message"), [(b"\xff a", "not valid UTF-8"), (b"{", "not valid JSON")])
def test_a_body_that_cannot_be_read_is_an_invalid_body(body: bytes, message: str) -> None:
    with pytest.raises(InvalidBody, match=message):
        PARSER.parse(body, JSON if body.startswith(b"{") else "text/plain")


def test_copies_are_one_masked_copy_per_scored_token_per_text() -> None:
    model = EchoModel()
    per_text = PARSER.copies(ScoreRequest(texts=("a bb ccc", "dd"), batched=True), model)
    assert [len(text.copies) for text in per_text] == [3, 1]
    for text in per_text:
        for position, copy in enumerate(text.copies, start=1):
            assert copy.input_ids[position] == model.mask_token_id and copy.answer_positions == (position,)


@pytest.mark.parametrize(
    ("texts", "error", "field", "message"),
    [
        (("  ",), InvalidInput, "inputs", "the text is empty"),
        (("fine", ""), InvalidInput, "inputs[1]", "inputs[1] is empty"),
        (("x" * 32_769,), TextTooLong, "inputs", "32769 characters"),
        (("w " * 5000,), TextTooLong, "inputs", "5002 tokens; the limit is 4096 (--max-text-tokens)"),
    ],
)
def test_a_text_that_cannot_be_scored_is_refused_naming_it(
    texts: tuple[str, ...], error: type[InvalidInput], field: str, message: str
) -> None:
    with pytest.raises(error) as refused:
        PARSER.copies(ScoreRequest(texts=texts, batched=len(texts) > 1), EchoModel())
    assert refused.value.field == field and message in refused.value.message


def test_a_text_with_more_tokens_than_max_score_tokens_is_too_long() -> None:
    parser = ScoreRequestParser(settings_from({"max_score_tokens": 3}))
    assert len(parser.copies(ScoreRequest(texts=("a b c",), batched=False), EchoModel())[0].copies) == 3
    with pytest.raises(TextTooLong, match="4 tokens to score; the limit is 3"):
        parser.copies(ScoreRequest(texts=("a b c d",), batched=False), EchoModel())


def test_a_text_of_special_tokens_only_has_nothing_to_score() -> None:
    class Empty(EchoModel):
        def encode_words(self, text: str) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
            return (101, 102), (None, None)

    with pytest.raises(InvalidInput, match="holds no token to score"):
        PARSER.copies(ScoreRequest(texts=("...",), batched=False), Empty())


def test_more_copies_in_all_than_the_queue_holds_are_refused() -> None:
    parser = ScoreRequestParser(settings_from({"max_queue": 4}))
    with pytest.raises(InvalidInput, match="scores 5 tokens in all; the limit is 4") as refused:
        parser.copies(ScoreRequest(texts=("a b c", "d e"), batched=True), EchoModel())
    assert refused.value.field == "inputs"


def test_a_text_of_several_is_named_by_the_element_asked_for() -> None:
    with pytest.raises(InvalidInput, match="sentence 2 is empty"):
        PARSER.copies(ScoreRequest(texts=("a", " "), batched=True), EchoModel(), element="sentence {number}")


SCORE = TextScore(
    score=-2.5, tokens=[{"token": 7, "token_str": "a", "score": -1.0}, {"token": 8, "token_str": "b", "score": -1.5}]
)


def test_a_text_score_has_its_tokens_only_when_asked() -> None:
    assert text_score_json(SCORE, with_tokens=False) == {"score": -2.5, "windows": 1}
    assert text_score_json(SCORE, with_tokens=True, windows=3) == {"score": -2.5, "windows": 3, "tokens": SCORE.tokens}


def test_one_string_in_answers_one_object_and_a_list_answers_a_list_in_order() -> None:
    other = TextScore(score=-0.5, tokens=[])
    single = ScoreRequest(texts=("a",), batched=False)
    assert json.loads(score_response_body(single, [SCORE], [1])) == {"score": -2.5, "windows": 1}
    batched = ScoreRequest(texts=("a", "b"), batched=True, tokens=True)
    assert json.loads(score_response_body(batched, [SCORE, other], [2, 1])) == [
        {"score": -2.5, "windows": 2, "tokens": SCORE.tokens},
        {"score": -0.5, "windows": 1, "tokens": []},
    ]
