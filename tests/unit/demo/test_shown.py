"""What the page shows (demo/shown.py): guesses, the filled-in sentence, names, and the API's
errors in the form's words, checked against the same mistakes sent to the API."""

from __future__ import annotations

import pytest

from maskserve.demo.shown import (
    FILL_MASK_FIELDS,
    SCORE_FIELDS,
    Segment,
    display_name,
    filled_sentence,
    guesses,
    page_error,
    percent,
)
from maskserve.errors import DeadlineExceeded, InvalidInput, ServiceUnavailable
from maskserve.model_api import Prediction
from tests.conftest import ClientFactory
from tests.unit.demo.test_page import PARIS, Page


def prediction(token_str: str, score: float) -> Prediction:
    return {"score": score, "token": 1, "token_str": token_str, "sequence": f"a {token_str}"}


def test_guess_bars_are_scaled_to_the_top_guess_and_never_empty() -> None:
    rows = guesses([prediction("city", 0.5), prediction("town", 0.25), prediction("x", 0.0)])
    assert [(row.rank, row.word, row.width) for row in rows] == [(1, "city", 100), (2, "town", 50), (3, "x", 1)]
    assert rows[0].percent == "50.0%"


def test_a_tiny_probability_reads_as_under_a_tenth_of_a_percent() -> None:
    assert percent(0.0001) == "<0.1%" and percent(0.0) == "0.0%" and percent(0.123) == "12.3%"


def test_the_typed_text_is_kept_with_each_mask_filled_by_its_top_guess() -> None:
    masks = [[prediction("capital", 0.9)], [prediction("france", 0.8)]]
    assert filled_sentence("Paris is the [MASK] of [MASK].", "[MASK]", masks) == (
        Segment("Paris is the "),
        Segment("capital", filled=True),
        Segment(" of "),
        Segment("france", filled=True),
        Segment("."),
    )


def test_a_mask_count_that_disagrees_with_the_text_shows_the_pipelines_sentence() -> None:
    assert filled_sentence("no mask here", "[MASK]", [[prediction("x", 0.5)]]) == (Segment("a x"),)


def test_a_local_folder_is_shown_by_its_last_two_parts_only() -> None:
    assert display_name("/srv/models/acme/bert") == "acme/bert"
    assert display_name("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"


@pytest.mark.parametrize(
    ("api_field", "fields", "form_field", "words"),
    [
        ("parameters.top_k", FILL_MASK_FIELDS, "top_k", "The number of guesses"),
        ("parameters.metric", SCORE_FIELDS, "metric", "The metric"),
        ("inputs", SCORE_FIELDS, "sentences", "The list of sentences"),
    ],
)
def test_an_api_error_is_said_in_the_forms_words_and_marks_its_input(
    api_field: str, fields: dict[str, tuple[str, str]], form_field: str, words: str
) -> None:
    shown = page_error(InvalidInput(f"{api_field} must not be empty", field=api_field), fields)
    assert shown.message == f"{words} must not be empty."
    assert shown.field == form_field or (form_field == "sentences" and shown.field == "text")


def test_load_and_time_errors_say_what_to_do_and_mark_no_input() -> None:
    busy = page_error(ServiceUnavailable("queue full", retry_after=3))
    assert busy.title == "The server is busy" and "3 seconds" in busy.message and busy.field == ""
    late = page_error(DeadlineExceeded("deadline"))
    assert late.title == "That took too long" and late.field == ""


async def test_the_form_says_what_the_api_says_of_the_same_mistake(make_client: ClientFactory) -> None:
    client = await make_client()
    for top_k in (0, "abc"):
        api = await client.post("/", json={"inputs": PARIS, "parameters": {"top_k": top_k}})
        assert api.status == 422
        said = (await api.json())["error"]
        assert said.startswith("parameters.top_k ")
        response = await client.post("/demo", data={"text": PARIS, "top_k": str(top_k)})
        assert response.status == 422
        page = Page(await response.text())
        assert said.replace("parameters.top_k", "The number of guesses") + "." in page.error


async def test_the_score_form_says_what_score_says_of_an_unknown_metric(make_client: ClientFactory) -> None:
    client = await make_client()
    api = await client.post("/score", json={"inputs": [PARIS], "parameters": {"metric": "l2r"}})
    assert api.status == 422
    said = (await api.json())["error"]
    response = await client.post("/demo/score", data={"sentences": PARIS, "metric": "l2r"})
    page = Page(await response.text())
    assert said.replace("parameters.metric", "The metric") + "." in page.score_error
