"""The checks every task's request shares (tasks/request_checks.py): a JSON body within its limits,
a schema's complaint in words that name the field, and the length checks."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from maskserve.errors import InvalidBody, InvalidInput, TextTooLong
from maskserve.tasks.request_checks import (
    check_inputs_count,
    check_text_length,
    decode_body,
    json_depth,
    load_json,
    validate,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["inputs"],
    "additionalProperties": False,
    "properties": {
        "inputs": {"type": "string"},
        "parameters": {
            "type": "object",
            "properties": {"top_k": {"type": ["integer", "null"], "minimum": 1, "maximum": 5}},
        },
    },
}


def refusal(document: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        validate(jsonschema.Draft202012Validator(SCHEMA), document)
    return caught.value


def test_a_body_nested_deeper_than_the_limit_is_refused_before_it_is_walked() -> None:
    assert json_depth({"a": [[1]]}, limit=10) == 3
    with pytest.raises(InvalidBody, match="nested too deeply"):
        load_json("[" * 20 + "]" * 20, max_depth=8)


def test_a_body_that_is_not_json_says_so() -> None:
    with pytest.raises(InvalidBody, match="not valid JSON"):
        load_json('{"inputs": ', max_depth=8)


def test_a_body_that_is_not_utf8_names_the_byte() -> None:
    with pytest.raises(InvalidBody, match="byte 1"):
        decode_body(b"a\xff")


def test_a_wrong_type_is_said_in_words_and_names_the_field() -> None:
    error = refusal({"inputs": "x", "parameters": {"top_k": "many"}})
    assert error.message == "parameters.top_k must be a whole number or null"
    assert error.field == "parameters.top_k"


def test_a_number_out_of_range_gives_both_bounds() -> None:
    assert refusal({"inputs": "x", "parameters": {"top_k": 9}}).message == "parameters.top_k must be between 1 and 5"


def test_a_missing_field_is_named_as_the_field() -> None:
    error = refusal({})
    assert error.message == 'body needs "inputs"' and error.field == "inputs"


def test_unknown_fields_are_named_but_never_echoed_whole() -> None:
    error = refusal({"inputs": "x", **{f"k{i}": i for i in range(50)}})
    assert error.message.startswith('body: unknown fields "k0", "k1", "k2" and 47 more')


def test_an_over_long_inputs_list_is_refused_before_the_schema_runs() -> None:
    check_inputs_count({"inputs": ["a", "b"]}, limit=2)
    with pytest.raises(InvalidInput, match="more than 2 items"):
        check_inputs_count({"inputs": ["a", "b", "c"]}, limit=2)


def test_a_text_over_the_character_limit_names_where_it_is() -> None:
    with pytest.raises(TextTooLong, match="inputs\\[1\\] has 6 characters; the limit is 5"):
        check_text_length("abcdef", "inputs[1]", "inputs[1]", max_chars=5)
