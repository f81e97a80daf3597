"""The demo page in headless Chromium against the real server on the default model.

Each behaviour is checked with JavaScript on (fetch, no reload) and off (plain form post), since
the page must work both ways.
"""

from __future__ import annotations

import itertools
import json
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from tests.system.browser.conftest import LAPTOP, PHONE, OpenPage

pytestmark = pytest.mark.browser

PARIS = "Paris is the [MASK] of France."
SCRIPT = "<script>alert(1)</script>[MASK]"
SCORED = ["Paris is the capital of France.", "The dog barked at the mailman unbelievably loudly."]
BOTH_MODES = pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])


def fill_in(page: Page, text: str, top_k: int | None = None) -> None:
    page.locator("#text").fill(text)
    if top_k is not None:
        page.locator("#top_k").fill(str(top_k))
    page.locator("#submit").click()


def bar_widths(page: Page) -> list[float]:
    """Drawn widths of the bars, in CSS pixels, as the reader sees them."""
    fills = page.locator("table.guesses .bar .fill")
    return [box["width"] for box in (fills.nth(i).bounding_box() for i in range(fills.count())) if box]


def rows(page: Page) -> Locator:
    return page.locator("table.guesses tbody tr")


@BOTH_MODES
def test_typed_sentence_gets_predictions_drawn_as_bars(open_page: OpenPage, javascript: bool, artifacts: Path) -> None:
    watched = open_page(javascript=javascript)
    page = watched.page
    expect(page.locator("#mask-token")).to_have_text("[MASK]")
    if javascript:
        page.evaluate("window.stillHere = true")
    fill_in(page, PARIS, top_k=5)
    expect(rows(page)).to_have_count(5)
    # The default model's top guess for the Paris sentence ("city", about 0.11).
    expect(page.locator("table.guesses td.word").first).to_have_text("city")
    expect(page.locator("#filled-sentence mark")).to_have_text("city")
    expect(page.locator("#filled-sentence")).to_have_text("Paris is the city of France.")
    expect(page.locator("#timing")).to_contain_text("Queued")
    expect(page.locator("#timing")).to_contain_text("Computing")
    widths = bar_widths(page)
    track = page.locator("table.guesses .bar").first.bounding_box()
    assert track is not None and len(widths) == 5
    assert widths[0] == pytest.approx(track["width"], abs=1)  # the top guess fills its track
    assert all(0 < w <= prev for prev, w in itertools.pairwise(widths))
    expect(page.locator("#text")).to_have_value(PARIS)
    if javascript:
        assert page.evaluate("window.stillHere") is True, "the page reloaded instead of using fetch"
        assert page.url.endswith("/")
    else:
        assert page.url.endswith("/demo")
    page.screenshot(path=artifacts / f"answered-laptop-{'js' if javascript else 'no-js'}.png", full_page=True)
    watched.assert_clean()


@BOTH_MODES
def test_a_pasted_text_longer_than_the_model_reads_is_answered_in_windows(
    open_page: OpenPage, javascript: bool
) -> None:
    # The default model reads 512 tokens: a text of about 1,500, a blank near each end.
    long = "The [MASK] sat on the mat. " + "The dog ran in the park with his friend. " * 150 + "It was a [MASK] day."
    watched = open_page(javascript=javascript)
    page = watched.page
    fill_in(page, long, top_k=3)
    expect(page.locator("table.guesses")).to_have_count(2)
    expect(rows(page)).to_have_count(6)
    expect(page.locator("#filled-sentence mark")).to_have_count(2)
    expect(page.locator("#windows")).to_have_text("Read in 2 windows")
    expect(page.locator("#text")).to_have_value(long)
    watched.assert_clean()


def test_busy_state_shows_while_waiting(open_page: OpenPage) -> None:
    watched = open_page(javascript=True)
    page = watched.page
    held: list[Route] = []
    page.route("**/demo", lambda route: held.append(route))  # hold the request until the test lets it go
    fill_in(page, PARIS)
    expect(page.locator("#fill-form")).to_have_attribute("aria-busy", "true")
    expect(page.locator("#submit")).to_be_disabled()
    expect(page.locator("#submit")).to_contain_text("Filling in")
    for _ in range(200):  # let the route event arrive (it is dispatched between API calls)
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1
    held[0].continue_()
    expect(rows(page)).to_have_count(5)
    expect(page.locator("#fill-form")).to_have_attribute("aria-busy", "false")
    expect(page.locator("#submit")).to_be_enabled()
    expect(page.locator("#submit")).to_have_text("Fill in")
    watched.assert_clean()


def test_example_runs_in_one_click_with_javascript(open_page: OpenPage) -> None:
    watched = open_page(javascript=True)
    page = watched.page
    page.locator("a.example").first.click()
    expect(rows(page)).to_have_count(5)
    expect(page.locator("#text")).to_have_value(PARIS)
    watched.assert_clean()


def test_example_fills_the_box_without_javascript(open_page: OpenPage) -> None:
    watched = open_page(javascript=False)
    page = watched.page
    expect(page.locator("#insert-mask")).to_be_hidden()  # a JavaScript-only helper
    page.locator("a.example").first.click()
    expect(page.locator("#text")).to_have_value(PARIS)
    expect(rows(page)).to_have_count(0)
    page.locator("#submit").click()
    expect(rows(page)).to_have_count(5)
    watched.assert_clean()


@BOTH_MODES
def test_sentence_without_mask_shows_the_error_inline_and_keeps_the_text(
    open_page: OpenPage, javascript: bool, artifacts: Path
) -> None:
    watched = open_page(javascript=javascript)
    page = watched.page
    fill_in(page, "Paris is the capital of France.")
    error = page.locator("#form-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("Nothing to fill in")
    expect(error).to_contain_text("[MASK]")
    expect(page.locator("#text")).to_have_value("Paris is the capital of France.")
    expect(page.locator("#text")).to_have_attribute("aria-invalid", "true")
    expect(rows(page)).to_have_count(0)
    page.screenshot(path=artifacts / f"error-{'js' if javascript else 'no-js'}.png")
    # The next good sentence clears the error.
    fill_in(page, PARIS)
    expect(rows(page)).to_have_count(5)
    expect(error).to_be_hidden()
    expect(page.locator("#text")).not_to_have_attribute("aria-invalid", "true")
    watched.assert_clean()


@BOTH_MODES
def test_script_sentence_is_shown_as_text_and_fires_no_dialog(open_page: OpenPage, javascript: bool) -> None:
    watched = open_page(javascript=javascript)
    page = watched.page
    fill_in(page, SCRIPT, top_k=3)
    expect(rows(page)).to_have_count(3)
    expect(page.locator("#filled-sentence")).to_contain_text("<script>alert(1)</script>")
    expect(page.locator("#text")).to_have_value(SCRIPT)
    # Only the page's own script element exists: nothing typed became markup.
    assert page.locator("script").count() == 1
    assert watched.dialogs == []
    watched.assert_clean()


def test_phone_sized_window_has_no_horizontal_overflow(open_page: OpenPage, artifacts: Path) -> None:
    watched = open_page(javascript=True, viewport=PHONE)
    page = watched.page
    # A long unbroken word is the usual way a phone layout overflows.
    fill_in(page, "Pneumonoultramicroscopicsilicovolcanoconiosis-and-more is a [MASK] word.")
    expect(rows(page)).to_have_count(5)
    score(page, "Pneumonoultramicroscopicsilicovolcanoconiosis-and-more is a long word.", metric="within_word_l2r")
    expect(page.locator("table.scores")).to_have_count(1)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    for selector in ("#fill-form", "table.guesses", "#filled-sentence", ".examples", "#score-form", "table.scores"):
        box = page.locator(selector).first.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    page.screenshot(path=artifacts / "answered-phone.png", full_page=True)
    watched.assert_clean()


def test_laptop_window_shows_form_and_answer_side_by_side(open_page: OpenPage, artifacts: Path) -> None:
    watched = open_page(javascript=True, viewport=LAPTOP)
    page = watched.page
    fill_in(page, PARIS)
    expect(rows(page)).to_have_count(5)
    ask = page.locator("section.ask").bounding_box()
    answer = page.locator("#result").bounding_box()
    assert ask is not None and answer is not None
    assert answer["x"] >= ask["x"] + ask["width"]  # two columns, not stacked
    page.screenshot(path=artifacts / "demo.png", full_page=True)
    watched.assert_clean()


def post_score(server_url: str, sentences: list[str], metric: str) -> list[dict[str, object]]:
    """What ``POST /score`` answers for ``sentences``, each with its tokens."""
    body = json.dumps({"inputs": sentences, "parameters": {"metric": metric, "tokens": True}}).encode()
    request = urllib.request.Request(server_url + "score", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: list[dict[str, object]] = json.loads(response.read())
    return answer


def score(page: Page, sentences: str, metric: str | None = None) -> None:
    page.locator("#sentences").fill(sentences)
    if metric is not None:
        page.locator("#metric").select_option(metric)
    page.locator("#score-submit").click()


def assert_shown_close(shown: Locator, scores: list[float]) -> None:
    """Each shown score is ``scores``' at two decimals. The page's scores and the API's come from
    two requests, batched with other neighbours: their floats may differ in the last bits, enough
    to round the other way at the second decimal, so each is held within that rounding."""
    expect(shown).to_have_count(len(scores))
    texts = shown.all_inner_texts()
    assert all(abs(float(text) - score) <= 0.0051 for text, score in zip(texts, scores, strict=True)), (texts, scores)


@BOTH_MODES
def test_scored_sentences_show_what_post_score_answers_with_a_bar_per_token(
    open_page: OpenPage, server_url: str, javascript: bool, artifacts: Path
) -> None:
    watched = open_page(javascript=javascript)
    page = watched.page
    if javascript:
        page.evaluate("window.stillHere = true")
    score(page, "\n".join(SCORED), metric="within_word_l2r")
    expect(page.locator("table.scores")).to_have_count(len(SCORED))
    api = post_score(server_url, SCORED, "within_word_l2r")
    expect(page.locator(".scored-sentence")).to_have_text(SCORED)
    assert_shown_close(page.locator(".sentence-score"), [float(text["score"]) for text in api])  # type: ignore[arg-type]
    tokens = [token for text in api for token in text["tokens"]]  # type: ignore[attr-defined]
    expect(page.locator("table.scores td.word")).to_have_text([token["token_str"] for token in tokens])
    assert_shown_close(page.locator("table.scores .logp"), [float(token["score"]) for token in tokens])
    # One bar per token, drawn, and longer for a likelier token (a pixel's rounding apart).
    fills = page.locator("table.scores .bar .fill")
    boxes = [fills.nth(i).bounding_box() for i in range(fills.count())]
    widths = [box["width"] for box in boxes if box]
    assert len(widths) == len(tokens) and all(width > 0 for width in widths)
    by_likelihood = [width for _, width in sorted(zip([token["score"] for token in tokens], widths))]
    assert all(later >= earlier - 1 for earlier, later in itertools.pairwise(by_likelihood))
    expect(page.locator("#sentences")).to_have_value("\n".join(SCORED))
    expect(page.locator("#metric")).to_have_value("within_word_l2r")
    expect(page.locator("#score-timing")).to_contain_text("Computing")
    if javascript:
        assert page.evaluate("window.stillHere") is True, "the page reloaded instead of using fetch"
        assert page.url.endswith("/")
    else:
        assert page.url.endswith("/demo/score")
    page.screenshot(path=artifacts / f"scored-{'js' if javascript else 'no-js'}.png", full_page=True)
    watched.assert_clean()


@BOTH_MODES
def test_empty_scoring_form_shows_the_error_inline_and_the_next_sentence_clears_it(
    open_page: OpenPage, javascript: bool
) -> None:
    watched = open_page(javascript=javascript)
    page = watched.page
    score(page, "   ")
    error = page.locator("#score-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("The list of sentences must not be empty")
    expect(page.locator("#sentences")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#form-error")).to_be_hidden()
    score(page, SCORED[0])
    expect(page.locator("table.scores")).to_have_count(1)
    expect(error).to_be_hidden()
    expect(page.locator("#sentences")).not_to_have_attribute("aria-invalid", "true")
    watched.assert_clean()
