"""Request parsing, validation and the response shape, without HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest

from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.errors import ClientError, InvalidBody, InvalidInput, NoMaskToken, TextTooLong
from maskserve.model_api import Prediction, TextPredictions, text_answer_json
from maskserve.tasks.fill_mask_request import FillMaskRequest, RequestParser, response_body

JSON = "application/json"
PARSER = RequestParser(Settings())


def parse_json(document: Any, parser: RequestParser = PARSER) -> FillMaskRequest:
    return parser.parse(json.dumps(document).encode(), JSON)


def rejection(error: type[ClientError], call: Any, *args: Any) -> ClientError:
    """The error ``call(*args)`` raises, checked to be exactly of class ``error``."""
    with pytest.raises(ClientError) as caught:
        call(*args)
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value.message}"
    return caught.value


# -- raw text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "application/octet-stream", ""]
)
def test_non_json_body_is_the_raw_text(content_type: str) -> None:
    request = PARSER.parse(b"paris is the [MASK] of france.", content_type)
    assert request == FillMaskRequest(texts=("paris is the [MASK] of france.",), batched=False, top_k=5, targets=None)


def test_form_encoded_body_is_never_form_decoded() -> None:
    request = PARSER.parse(b"a=b&c=[MASK]+x%20y", "application/x-www-form-urlencoded")
    assert request.texts == ("a=b&c=[MASK]+x%20y",)


def test_raw_text_keeps_unicode() -> None:
    assert PARSER.parse("café [MASK] ünïcode".encode(), "text/plain").texts == ("café [MASK] ünïcode",)


def test_raw_text_uses_the_configured_default_top_k() -> None:
    assert RequestParser(Settings(default_top_k=3)).parse(b"[MASK]", "text/plain").top_k == 3


# -- JSON -------------------------------------------------------------------------------------


def test_json_string_input() -> None:
    assert parse_json({"inputs": "a [MASK]."}) == FillMaskRequest(
        texts=("a [MASK].",), batched=False, top_k=5, targets=None
    )


def test_json_list_input_is_batched_even_with_one_text() -> None:
    assert parse_json({"inputs": ["a [MASK]."]}).batched is True
    assert parse_json({"inputs": ["a [MASK].", "b [MASK]"]}).texts == ("a [MASK].", "b [MASK]")


def test_json_parameters_top_k_and_targets() -> None:
    request = parse_json({"inputs": "x [MASK]", "parameters": {"top_k": 3, "targets": ["city", "dog"]}})
    assert (request.top_k, request.targets) == (3, ("city", "dog"))
    assert parse_json({"inputs": "x [MASK]", "parameters": {"targets": "city"}}).targets == ("city",)


@pytest.mark.parametrize("parameters", [None, {}, {"top_k": None, "targets": None}, {"top_k": None}, {"targets": None}])
def test_null_or_missing_parameters_mean_defaults(parameters: Any) -> None:
    request = parse_json({"inputs": "x [MASK]", "parameters": parameters})
    assert (request.top_k, request.targets) == (5, None)


def test_inference_api_options_are_accepted_and_ignored() -> None:
    assert parse_json({"inputs": "x [MASK]", "options": {"wait_for_model": True}}).texts == ("x [MASK]",)


def test_json_content_type_with_charset_still_json() -> None:
    # aiohttp hands the view the bare media type; upper case must not make it raw text.
    assert PARSER.parse(b'{"inputs": "x [MASK]"}', "Application/JSON").texts == ("x [MASK]",)


# -- rejections of the body -------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", JSON])
def test_invalid_utf8_is_400(content_type: str) -> None:
    error = rejection(InvalidBody, PARSER.parse, b"caf\xe9 [MASK]", content_type)
    assert error.status == 400 and error.kind == "invalid_body"
    assert "UTF-8" in error.message


@pytest.mark.parametrize("body", [b"{", b"", b'{"inputs": "x [MASK]",}', b"nan-sense"])
def test_invalid_json_is_400(body: bytes) -> None:
    error = rejection(InvalidBody, PARSER.parse, body, JSON)
    assert error.status == 400 and "not valid JSON" in error.message


@pytest.mark.parametrize("depth", [200_000, 900, 40])
def test_deeply_nested_json_is_400_not_a_crash(depth: int) -> None:
    body = b'{"inputs": ' + b"[" * depth + b"]" * depth + b"}"
    error = rejection(InvalidBody, PARSER.parse, body, JSON)
    assert "nested too deeply" in error.message


def test_slightly_nested_inputs_are_a_422_shape_error() -> None:
    assert rejection(InvalidInput, parse_json, {"inputs": [[["x [MASK]"]]]}).status == 422


@pytest.mark.parametrize(
    ("document", "named"),
    [
        (None, "object"),
        ([], "object"),
        ("x [MASK]", "object"),
        ({}, '"inputs"'),
        ({"inputs": 3}, "inputs"),
        ({"inputs": None}, "inputs"),
        ({"inputs": [1, 2]}, "inputs"),
        ({"inputs": []}, "inputs"),
        ({"inputs": "x [MASK]", "parameters": []}, "parameters"),
        ({"inputs": "x [MASK]", "parameters": {"top_k": "3"}}, "top_k"),
        ({"inputs": "x [MASK]", "parameters": {"top_k": True}}, "top_k"),
        ({"inputs": "x [MASK]", "parameters": {"top_k": 2.5}}, "top_k"),
        ({"inputs": "x [MASK]", "parameters": {"targets": 5}}, "targets"),
        ({"inputs": "x [MASK]", "parameters": {"targets": [5]}}, "targets"),
    ],
)
def test_wrong_shape_or_type_is_422_naming_the_field(document: Any, named: str) -> None:
    error = rejection(InvalidInput, parse_json, document)
    assert error.status == 422 and error.kind == "invalid_input"
    assert named in error.message


@pytest.mark.parametrize("top_k", [0, -1, 101])
def test_top_k_out_of_range_is_422(top_k: int) -> None:
    error = rejection(InvalidInput, parse_json, {"inputs": "x [MASK]", "parameters": {"top_k": top_k}})
    assert "top_k" in error.message and "100" in error.message


def test_top_k_at_its_limit_is_accepted() -> None:
    assert parse_json({"inputs": "x [MASK]", "parameters": {"top_k": 100}}).top_k == 100


def test_empty_targets_list_is_422() -> None:
    error = rejection(InvalidInput, parse_json, {"inputs": "x [MASK]", "parameters": {"targets": []}})
    assert "targets" in error.message and "empty" in error.message


def test_too_many_targets_is_422() -> None:
    parser = RequestParser(Settings(max_targets=3))
    error = rejection(
        InvalidInput, parse_json, {"inputs": "x [MASK]", "parameters": {"targets": ["a", "b", "c", "d"]}}, parser
    )
    assert "targets" in error.message and "3" in error.message


def test_too_many_inputs_is_422() -> None:
    parser = RequestParser(Settings(max_inputs=2))
    error = rejection(InvalidInput, parse_json, {"inputs": ["[MASK]"] * 3}, parser)
    assert "inputs" in error.message and "2" in error.message


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"inputs": "x [MASK]", "extra": 1}, "extra"),
        ({"inputs": "x [MASK]", "parameters": {"top_k": 2, "temperature": 1}}, "temperature"),
    ],
)
def test_unknown_fields_are_422_naming_them(document: Any, field: str) -> None:
    error = rejection(InvalidInput, parse_json, document)
    assert field in error.message and "unknown" in error.message


# -- rejections of the texts (need the model's tokenizer) --------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_or_blank_text_is_422(text: str, bert_engine: FillMaskEngine) -> None:
    request = PARSER.parse(text.encode(), "text/plain")
    error = rejection(InvalidInput, PARSER.plans, request, bert_engine)
    assert error.status == 422 and "empty" in error.message and "[MASK]" in error.message


def test_no_mask_names_bert_mask_token(bert_engine: FillMaskEngine) -> None:
    request = PARSER.parse(b"paris is the capital of france.", "text/plain")
    error = rejection(NoMaskToken, PARSER.plans, request, bert_engine)
    assert error.status == 422 and error.kind == "no_mask_token"
    assert "[MASK]" in error.message and "<mask>" not in error.message


def test_no_mask_names_roberta_mask_token(roberta_engine: FillMaskEngine) -> None:
    # A BERT mask in a RoBERTa request is no mask at all, and the message says which one to use.
    request = PARSER.parse(b"paris is the [MASK] of france.", "text/plain")
    error = rejection(NoMaskToken, PARSER.plans, request, roberta_engine)
    assert "<mask>" in error.message and "[MASK]" not in error.message


def test_no_mask_in_one_of_several_inputs_names_its_index(bert_engine: FillMaskEngine) -> None:
    request = parse_json({"inputs": ["a [MASK].", "no mask here"]})
    assert "inputs[1]" in rejection(NoMaskToken, PARSER.plans, request, bert_engine).message


def test_text_over_the_character_limit_is_422(bert_engine: FillMaskEngine) -> None:
    parser = RequestParser(Settings(max_text_chars=20))
    request = parser.parse(b"the [MASK] is a big red dog.", "text/plain")
    error = rejection(TextTooLong, parser.plans, request, bert_engine)
    assert error.kind == "text_too_long" and "28 characters" in error.message and "20" in error.message


def test_text_over_max_text_tokens_is_422_naming_both_numbers(bert_engine: FillMaskEngine) -> None:
    parser = RequestParser(Settings(max_text_tokens=150))
    request = parser.parse(("the dog " * 100 + "[MASK]").encode(), "text/plain")
    error = rejection(TextTooLong, parser.plans, request, bert_engine)
    assert "the text has 203 tokens; the limit is 150 (--max-text-tokens)" in error.message


def test_a_text_longer_than_the_model_is_read_in_windows_that_answer_its_masks(bert_engine: FillMaskEngine) -> None:
    # 3 masks: two close together at the start, one far past the model's 128 tokens.
    text = "[MASK] dog [MASK] " + "the dog " * 150 + "[MASK] end"
    (plan,) = PARSER.plans(PARSER.parse(text.encode(), "text/plain"), bert_engine)
    whole = plan.query.input_ids
    assert len(whole) > 2 * bert_engine.max_tokens and plan.windows == len(plan.reads) == 2
    masks = [i for i, token in enumerate(whole) if token == bert_engine.mask_token_id]
    answered = []
    for window in plan.reads:
        ids = window.input_ids
        assert len(ids) <= bert_engine.max_tokens and (ids[0], ids[-1]) == (whole[0], whole[-1])
        assert window.read_by_server and window.answer_positions is not None
        assert window.n_masks == len(window.answer_positions)
        assert all(ids[p] == bert_engine.mask_token_id for p in window.answer_positions)
        answered += window.answer_positions
    assert len(answered) == len(masks) == 3
    assert plan.queries == plan.reads and plan.decoded_predictions == plan.query.predictions


def test_a_text_that_fits_is_one_query_read_whole(bert_engine: FillMaskEngine) -> None:
    (plan,) = PARSER.plans(PARSER.parse(b"the [MASK] sat.", "text/plain"), bert_engine)
    assert plan.queries == (plan.query,) and plan.windows == 1 and not plan.folds
    assert plan.query.answer_positions is None and not plan.query.read_by_server


def test_long_text_refuse_asks_for_the_422_rather_than_windows(bert_engine: FillMaskEngine) -> None:
    body = {"inputs": "the dog " * 100 + "[MASK]", "parameters": {"long_text": "refuse"}}
    error = rejection(TextTooLong, PARSER.plans, parse_json(body), bert_engine)
    assert "203 tokens; this model reads at most 128" in error.message and "long_text" in error.message
    assert rejection(InvalidInput, parse_json, {"inputs": "[MASK]", "parameters": {"long_text": "cut"}}).field == (
        "parameters.long_text"
    )


def test_long_text_refuse_refuses_whole_word_copies_that_outgrow_the_model(bert_engine: FillMaskEngine) -> None:
    # The text fits (124 tokens); a word of 8 tokens grows its copies to 131.
    parameters = {"targets": ["new york city of new york city yes"], "long_text": "refuse"}
    body = {"inputs": "the dog " * 60 + "[MASK]", "parameters": parameters}
    error = rejection(TextTooLong, PARSER.plans, parse_json(body), bert_engine)
    assert error.field == "parameters.targets" and "reads at most 128" in error.message
    parameters["long_text"] = "window"
    (plan,) = PARSER.plans(parse_json(body), bert_engine)
    assert plan.reads == () and len(plan.copies) == len(plan.words[0]) == 8 and plan.windows == 1
    assert all(copy.n_tokens <= bert_engine.max_tokens for copy in plan.copies)


def test_blank_target_is_422(bert_engine: FillMaskEngine) -> None:
    request = parse_json({"inputs": "x [MASK]", "parameters": {"targets": ["city", " "]}})
    assert "targets" in rejection(InvalidInput, PARSER.plans, request, bert_engine).message


def test_multi_token_targets_is_whole_word_or_first_token(bert_engine: FillMaskEngine) -> None:
    parameters: dict[str, Any] = {"targets": ["city", "new city"]}
    body = {"inputs": "paris [MASK]", "parameters": parameters}
    assert parse_json(body).multi_token_targets == "whole_word"
    (plan,) = PARSER.plans(parse_json(body), bert_engine)
    new, city = bert_engine.tokenizer.convert_tokens_to_ids(["new", "city"])
    assert plan.query.target_ids == (city,) and plan.words == ((new, city),) and len(plan.copies) == 2
    parameters["multi_token_targets"] = "first_token"
    (plan,) = PARSER.plans(parse_json(body), bert_engine)
    assert plan.query.target_ids == (city, new) and not plan.has_words and plan.queries == (plan.query,)


def test_queries_carry_tokens_top_k_and_target_ids(bert_engine: FillMaskEngine) -> None:
    request = parse_json({"inputs": ["paris [MASK]", "[MASK] city"], "parameters": {"top_k": 2, "targets": "city"}})
    plans = PARSER.plans(request, bert_engine)
    assert not any(plan.has_words for plan in plans)
    queries = [plan.query for plan in plans]
    city = bert_engine.tokenizer.convert_tokens_to_ids("city")
    assert [q.input_ids for q in queries] == [bert_engine.encode("paris [MASK]"), bert_engine.encode("[MASK] city")]
    assert all(q.top_k == 2 and q.target_ids == (city,) for q in queries)


# -- the response shape -----------------------------------------------------------------------


def predictions(label: str, n: int = 2) -> list[Prediction]:
    return [Prediction(score=1.0 / (i + 1), token=i, token_str=f"{label}{i}", sequence=label) for i in range(n)]


def shaped(request: FillMaskRequest, answers: list[TextPredictions]) -> Any:
    """The answer's body as a client reads it: each text's JSON (made on the inference thread), joined."""
    return json.loads(response_body(request, [text_answer_json(answer) for answer in answers]))


def test_single_text_single_mask_is_a_flat_list() -> None:
    request = FillMaskRequest(texts=("a",), batched=False, top_k=2, targets=None)
    answer = predictions("a")
    assert shaped(request, [[answer]]) == answer


def test_single_text_several_masks_is_one_list_per_mask() -> None:
    request = FillMaskRequest(texts=("a",), batched=False, top_k=2, targets=None)
    first, second = predictions("m1"), predictions("m2")
    assert shaped(request, [[first, second]]) == [first, second]


def test_list_of_one_text_is_still_one_list_per_text() -> None:
    request = FillMaskRequest(texts=("a",), batched=True, top_k=2, targets=None)
    answer = predictions("a")
    assert shaped(request, [[answer]]) == [answer]


def test_list_of_texts_unwraps_single_masks_per_text() -> None:
    request = FillMaskRequest(texts=("a", "b"), batched=True, top_k=2, targets=None)
    a, b1, b2 = predictions("a"), predictions("b1"), predictions("b2")
    assert shaped(request, [[a], [b1, b2]]) == [a, [b1, b2]]
