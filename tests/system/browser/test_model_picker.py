"""The demo page of a server of two models: the picker chooses the model, and both forms answer
with it, as its own routes do. In headless Chromium, with JavaScript on and off."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.live_server import start_maskserve, wait_until_ready
from tests.system.browser.conftest import LAPTOP, SERVER_START_TIMEOUT, Watched

pytestmark = pytest.mark.browser

BOTH_MODES = pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
SENTENCE = "Paris is the <mask> of France."


@pytest.fixture(scope="module")
def two_models_url(roberta_dir: Path, artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m maskserve`` with the default model (``demo``, first) and a RoBERTa (``rob``)."""
    models = tmp_path_factory.mktemp("models") / "models.yaml"
    models.write_text(f"models:\n  - name: demo\n  - name: rob\n    source: {roberta_dir}\n", encoding="utf-8")
    server = start_maskserve("--models-file", str(models), log_path=artifacts / "browser-two-models.log")
    try:
        wait_until_ready(server, SERVER_START_TIMEOUT)
        yield server.url + "/"
    finally:
        server.stop()


def post_json(url: str, body: bytes) -> object:
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def open_page(browser: Browser, url: str, javascript: bool) -> Watched:
    context = browser.new_context(java_script_enabled=javascript, viewport=LAPTOP)  # type: ignore[arg-type]
    watched = Watched(context.new_page(), url.rstrip("/"))
    watched.page.goto(url)
    return watched


def pick(page: Page, name: str) -> None:
    page.locator("#model-select").select_option(name)
    page.locator("#model-switch").click()


@BOTH_MODES
def test_the_picked_model_answers_both_forms_as_its_own_routes(
    browser: Browser, two_models_url: str, javascript: bool
) -> None:
    watched = open_page(browser, two_models_url, javascript)
    page = watched.page
    # The first model is the page's default.
    expect(page.locator("#model-select")).to_have_value("demo")
    expect(page.locator("#mask-token")).to_have_text("[MASK]")
    pick(page, "rob")
    expect(page.locator("#model-select")).to_have_value("rob")
    expect(page.locator("#mask-token")).to_have_text("<mask>")
    assert "model=rob" in page.url

    expected = post_json(two_models_url + "models/rob", SENTENCE.encode())
    assert isinstance(expected, list)
    page.locator("#text").fill(SENTENCE)
    page.locator("#top_k").fill("5")
    page.locator("#submit").click()
    words = page.locator("table.guesses td.word")
    expect(words).to_have_count(5)
    assert words.all_inner_texts() == [p["token_str"].strip() or p["token_str"] for p in expected]

    scored = post_json(two_models_url + "models/rob/score", b"the dog barked.")
    assert isinstance(scored, dict)
    page.locator("#sentences").fill("the dog barked.")
    page.locator("#score-submit").click()
    expect(page.locator("#score-result")).to_contain_text(f"{scored['score']:.2f}")
    # Still the picked model after both answers.
    expect(page.locator("#mask-token")).to_have_text("<mask>")
    watched.assert_clean()
    page.context.close()


def test_an_unknown_model_in_the_address_shows_the_served_ones(browser: Browser, two_models_url: str) -> None:
    watched = open_page(browser, two_models_url + "?model=gpt", javascript=False)
    expect(watched.page.locator("#form-error")).to_contain_text("'demo', 'rob'")
    watched.page.context.close()
