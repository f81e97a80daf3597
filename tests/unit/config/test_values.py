"""The settings' value parsers (config/values.py): each value it takes, and why it refuses the rest
in words the loader puts after the flag and the value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from maskserve.config import values


@pytest.mark.parametrize(
    ("parse", "raw", "expected"),
    [
        (values.positive_int, "3", 3),
        (values.non_negative_int, "0", 0),
        (values.non_negative_float, "0.5", 0.5),
        (values.positive_float, "1e-3", 0.001),
        (values.port, "0", 0),
        (values.port, "65535", 65535),
        (values.flag, "yes", True),
        (values.flag, "0", False),
        (values.model_name, "bert-base_1.2", "bert-base_1.2"),
        (values.model_sources, " a, ,b ", ("a", "b")),
        (values.optional_str, "", None),
        (values.origins, "https://a.example:8443,*", "https://a.example:8443,*"),
        (values.exporters, "otlp, console", "otlp,console"),
        (values.exporters, "", None),
    ],
)
def test_a_good_value_is_taken_as_its_type(parse: Callable[[str], Any], raw: str, expected: Any) -> None:
    assert parse(raw) == expected


@pytest.mark.parametrize(
    ("parse", "raw", "reason"),
    [
        (values.positive_int, "0", "must be at least 1"),
        (values.non_negative_int, "-1", "must be 0 or more"),
        (values.non_negative_float, "nan", "must be a finite number >= 0"),
        (values.non_negative_float, "inf", "must be a finite number >= 0"),
        (values.positive_float, "0", "must be greater than 0"),
        (values.port, "65536", "must be between 0 and 65535"),
        (values.flag, "maybe", "must be true or false"),
        (values.model_name, "-bert", "starting with a letter or digit"),
        (values.model_name, "a" * 65, "must be 1-64 of"),
        (values.api_keys, "short", "each key needs 16 or more"),
        (values.origins, "https://a.example/", "is not * or scheme://host[:port]"),
        (values.exporters, "Zipkin!", "is not an exporter name"),
        (values.exporters, "none,otlp", "cannot be combined"),
    ],
)
def test_a_bad_value_is_refused_saying_why(parse: Callable[[str], Any], raw: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("*", r"\*").replace("[", r"\[").replace("]", r"\]")):
        parse(raw)


def test_a_choice_takes_only_its_options_and_names_them() -> None:
    parse = values.choice("auto", "cpu")
    assert parse("cpu") == "cpu"
    with pytest.raises(ValueError, match="must be one of auto, cpu"):
        parse("gpu")


def test_api_keys_are_joined_and_each_checked() -> None:
    first, second = "k" * 16, "abcdefghijklmnop=="
    assert values.api_keys(f"{first}, {second}") == f"{first},{second}"
