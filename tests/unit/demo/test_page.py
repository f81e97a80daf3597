"""The demo page over HTTP, through the real app factory (the browser tests live in tests/system/browser/)."""

from __future__ import annotations

import asyncio
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from maskserve.config.settings import Settings
from maskserve.demo.page import CONTENT_SECURITY_POLICY
from maskserve.demo.shown import percent
from maskserve.engine import FillMaskEngine
from maskserve.http.app import create_app
from maskserve.model_api import Query
from tests.conftest import CONTROL_KEY, ClientFactory
from tests.fakes import ControlledModel, EchoModel, default_parts
from tests.models import LONG_TEXT

PARIS = "paris is the [MASK] of france."
SCRIPT = "<script>alert(1)</script>[MASK]"


class Page(HTMLParser):
    """What a reader of the page sees: the box, the error, the table, the highlight."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.textarea: str | None = None
        self.textarea_attrs: dict[str, str | None] = {}
        self.sentences: str | None = None
        self.sentences_attrs: dict[str, str | None] = {}
        self.top_k_attrs: dict[str, str | None] = {}
        self.whole_words_attrs: dict[str, str | None] = {}
        self.metric_attrs: dict[str, str | None] = {}
        self.selected_metric: str | None = None
        self.error = ""
        self.error_hidden = False
        self.score_error = ""
        self.score_error_hidden = False
        self.sentence_scores: list[str] = []
        self.scored_sentences: list[str] = []
        self.log_probs: list[str] = []
        self.score_tokens: list[str] = []
        self.words: list[str] = []
        self.percents: list[str] = []
        self.bar_widths: list[int] = []
        self.marks: list[str] = []
        self.example_links: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self.forms: dict[str, dict[str, str | None]] = {}
        # The model picker's options and choice, and the model each form posts (hidden fields).
        self.models: list[str] = []
        self.picked_model: str | None = None
        self.posted_models: list[str | None] = []
        self._select: str | None = None
        self.texts_by_id: dict[str, str] = {}
        self._open: list[tuple[str, str | None, set[str]]] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = set((attributes.get("class") or "").split())
        if tag == "textarea" and attributes.get("id") == "sentences":
            self.sentences, self.sentences_attrs = "", attributes
        elif tag == "textarea":
            self.textarea, self.textarea_attrs = "", attributes
        elif tag == "select" and attributes.get("name") == "metric":
            self.metric_attrs, self._select = attributes, "metric"
        elif tag == "select":
            self._select = attributes.get("name")
        elif tag == "option" and self._select == "model":
            self.models.append(attributes.get("value") or "")
            if "selected" in attributes:
                self.picked_model = attributes.get("value")
        elif tag == "option" and "selected" in attributes:
            self.selected_metric = attributes.get("value")
        elif tag == "input" and attributes.get("name") == "model":
            self.posted_models.append(attributes.get("value"))
        elif tag == "input" and attributes.get("name") == "top_k":
            self.top_k_attrs = attributes
        elif tag == "input" and attributes.get("name") == "whole_words":
            self.whole_words_attrs = attributes
        elif tag == "form":
            self.forms[attributes.get("id") or ""] = attributes
        elif tag == "script":
            self.scripts.append(attributes)
        elif tag == "a" and "example" in classes:
            self.example_links.append(attributes.get("href") or "")
        elif tag == "span" and "fill" in classes:
            self.bar_widths += [int(c[2:]) for c in classes if c.startswith("w-")]
        if attributes.get("id") == "form-error":
            self.error_hidden = "hidden" in attributes
        if attributes.get("id") == "score-error":
            self.score_error_hidden = "hidden" in attributes
        if tag not in {"input", "link", "meta", "br"}:
            self._open.append((tag, attributes.get("id"), classes))

    def handle_endtag(self, tag: str) -> None:
        # As browsers do (HTML spec): one newline right after <textarea> is dropped.
        closing = self._open[-1][1] if self._open and self._open[-1][0] == "textarea" else None
        if closing == "sentences" and self.sentences is not None and self.sentences.startswith("\n"):
            self.sentences = self.sentences[1:]
        elif closing == "text" and self.textarea is not None and self.textarea.startswith("\n"):
            self.textarea = self.textarea[1:]
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for tag, element_id, _classes in self._open:
            if element_id:
                self.texts_by_id[element_id] = self.texts_by_id.get(element_id, "") + data
            if element_id == "form-error":
                self.error += data
            if element_id == "score-error":
                self.score_error += data
            if element_id == "sentences" and self.sentences is not None:
                self.sentences += data
            elif tag == "textarea" and self.textarea is not None:
                self.textarea += data
        tag, _, classes = self._open[-1] if self._open else ("", None, set())
        in_scores = any(t == "table" and "scores" in c for t, _, c in self._open)
        if tag == "td" and "word" in classes and in_scores:
            self.score_tokens.append(data)
        elif tag == "span" and "sentence-score" in classes:
            self.sentence_scores.append(data)
        elif tag == "span" and "scored-sentence" in classes:
            self.scored_sentences.append(data)
        elif tag == "span" and "logp" in classes:
            self.log_probs.append(data)
        elif tag == "td" and "word" in classes:
            self.words.append(data)
        elif tag == "span" and "pct" in classes:
            self.percents.append(data)
        elif tag == "mark":
            self.marks.append(data)


# Markup as the predicted word, to prove model output is escaped too.
SCRIPT_WORD = '<img src=x onerror="alert(2)">'


async def test_page_shows_model_mask_token_and_examples(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.get("/")
    assert response.status == 200
    assert response.content_type == "text/html"
    page = Page(await response.text())
    assert page.texts_by_id["mask-token"] == "[MASK]"
    assert page.texts_by_id["model-name"].strip()
    assert page.texts_by_id["model-runs-on"] == "cpu · float32"
    assert page.forms["fill-form"]["action"] == "/demo" and page.forms["fill-form"]["method"] == "post"
    assert page.forms["score-form"]["action"] == "/demo/score" and page.forms["score-form"]["method"] == "post"
    assert len(page.example_links) >= 3
    assert all(link.startswith("/?text=") and "%5BMASK%5D" in link for link in page.example_links)
    assert page.words == [] and page.error_hidden


async def test_roberta_page_names_its_own_mask_token(make_client: ClientFactory, roberta_engine: object) -> None:
    client = await make_client(engine=roberta_engine)
    page = Page(await (await client.get("/")).text())
    assert page.texts_by_id["mask-token"] == "<mask>"
    assert all("%3Cmask%3E" in link for link in page.example_links)


async def test_page_never_shows_the_server_model_path(make_client: ClientFactory) -> None:
    client = await make_client()
    full_path = default_parts(client).model.name
    html = await (await client.get("/")).text()
    assert full_path.startswith("/") and full_path not in html


async def test_example_link_fills_the_box_without_running_the_model(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.get("/", params={"text": "Hello [MASK] world", "top_k": "7"})
    page = Page(await response.text())
    assert page.textarea == "Hello [MASK] world"
    assert page.top_k_attrs["value"] == "7"
    assert page.words == []
    assert default_parts(client).batcher.scheduler.batches_run == 0


async def test_form_submission_renders_the_api_predictions(make_client: ClientFactory) -> None:
    client = await make_client()
    api = await (await client.post("/", json={"inputs": PARIS, "parameters": {"top_k": 3}})).json()
    response = await client.post("/demo", data={"text": PARIS, "top_k": "3"})
    assert response.status == 200
    assert response.content_type == "text/html"
    assert response.headers["Cache-Control"] == "no-store"
    assert {"X-Queue-Time-Ms", "X-Inference-Time-Ms", "X-Batch-Size"} <= set(response.headers)
    page = Page(await response.text())
    assert page.words == [p["token_str"] for p in api]
    assert page.percents == [f"{p['score']:.1%}" for p in api]
    # One bar per guess, the top one full and none longer than the one above it.
    assert page.bar_widths[0] == 100 and page.bar_widths == sorted(page.bar_widths, reverse=True)
    assert len(page.bar_widths) == 3
    assert page.marks == [api[0]["token_str"]]
    assert page.texts_by_id["filled-sentence"] == PARIS.replace("[MASK]", api[0]["token_str"])
    timing = page.texts_by_id["timing"]
    assert "Queued" in timing and "Computing" in timing and "Batch of" in timing
    assert page.textarea == PARIS


async def test_the_whole_words_box_answers_the_apis_whole_words_and_stays_ticked(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine, max_top_k=1000)
    text = "the [MASK] sat on the house ."
    # Past every one-piece word, so that words of several pieces rank in.
    top_k = len(wordpiece_engine.word_pieces().starts) + 10
    words = {"top_k": top_k, "whole_words": True}
    api = await (await client.post("/", json={"inputs": text, "parameters": words})).json()
    assert any(len(p["tokens"]) > 1 for p in api)
    response = await client.post("/demo", data={"text": text, "top_k": str(top_k), "whole_words": "on"})
    assert response.status == 200
    page = Page(await response.text())
    assert page.words == [p["token_str"] for p in api]
    assert page.percents == [percent(p["score"]) for p in api]
    assert "checked" in page.whole_words_attrs and page.whole_words_attrs.get("type") == "checkbox"
    # Unticked, the form sends no field: the pipeline's answer, and the box comes back unticked.
    plain = await (await client.post("/", json={"inputs": text, "parameters": {"top_k": top_k}})).json()
    page = Page(await (await client.post("/demo", data={"text": text, "top_k": str(top_k)})).text())
    assert page.words == [p["token_str"] for p in plain] != [p["token_str"] for p in api]
    assert "checked" not in page.whole_words_attrs
    # A link may tick it without running anything.
    assert "checked" in Page(await (await client.get("/", params={"whole_words": "on"})).text()).whole_words_attrs
    assert "checked" not in Page(await (await client.get("/")).text()).whole_words_attrs


async def test_two_masks_get_a_table_and_a_highlight_each(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo", data={"text": "the [MASK] sat on the [MASK].", "top_k": "2"})
    assert response.status == 200
    page = Page(await response.text())
    assert len(page.marks) == 2
    assert len(page.words) == 4


async def test_text_without_mask_is_shown_inline_with_the_text_kept(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo", data={"text": "Paris is the capital of France.", "top_k": "4"})
    assert response.status == 422
    assert response.content_type == "text/html"
    page = Page(await response.text())
    assert not page.error_hidden
    assert "[MASK]" in page.error and "Nothing to fill in" in page.error
    assert page.textarea == "Paris is the capital of France."
    assert page.textarea_attrs["aria-invalid"] == "true"
    assert page.top_k_attrs["value"] == "4"
    assert page.words == []


async def test_empty_text_is_shown_inline(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo", data={"text": "   ", "top_k": "5"})
    assert response.status == 422
    page = Page(await response.text())
    assert "empty" in page.error
    assert page.textarea == "   "


async def test_too_long_text_is_shown_inline_with_the_text_kept(make_client: ClientFactory) -> None:
    client = await make_client(max_text_chars=30)
    text = "a very long sentence with a [MASK] in it"
    response = await client.post("/demo", data={"text": text})
    assert response.status == 422
    page = Page(await response.text())
    assert "too long" in page.error and "30" in page.error
    assert page.textarea == text


async def test_bad_number_of_guesses_marks_that_field(make_client: ClientFactory) -> None:
    client = await make_client()
    # The API's own words for parameters.top_k, the field put as the form says it.
    for top_k, words in (
        ("0", "must be between 1 and 100"),
        ("abc", "must be a whole number"),
        ("101", "must be between 1 and 100"),
    ):
        response = await client.post("/demo", data={"text": PARIS, "top_k": top_k})
        assert response.status == 422
        page = Page(await response.text())
        assert "Check the number of guesses" in page.error and f"The number of guesses {words}" in page.error
        assert "parameters.top_k" not in page.error
        assert page.top_k_attrs["value"] == top_k
        assert page.top_k_attrs["aria-invalid"] == "true"
        assert "aria-invalid" not in page.textarea_attrs
        assert page.textarea == PARIS


async def test_leading_newline_in_the_text_survives_the_round_trip(make_client: ClientFactory) -> None:
    # HTML drops one newline right after <textarea>: the template must not lose the user's.
    client = await make_client()
    response = await client.post("/demo", data={"text": "\nno mask"})
    assert Page(await response.text()).textarea == "\nno mask"


async def test_script_text_is_escaped_in_the_box_and_the_answer(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo", data={"text": SCRIPT, "top_k": "2"})
    assert response.status == 200
    html = await response.text()
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    page = Page(html)
    assert page.textarea == SCRIPT
    assert page.texts_by_id["filled-sentence"].startswith("<script>alert(1)</script>")
    # The page's only script is its own static file.
    assert len(page.scripts) == 1 and (page.scripts[0]["src"] or "").startswith("/static/demo.js")


async def test_script_text_in_an_example_link_is_escaped(make_client: ClientFactory) -> None:
    client = await make_client()
    html = await (await client.get("/", params={"text": SCRIPT})).text()
    assert "<script>alert(1)" not in html
    assert Page(html).textarea == SCRIPT


async def test_model_output_is_escaped(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel(word=SCRIPT_WORD))
    response = await client.post("/demo", data={"text": "a [MASK] b"})
    assert response.status == 200
    html = await response.text()
    assert SCRIPT_WORD not in html
    page = Page(html)
    assert page.words == [SCRIPT_WORD]
    assert page.marks == [SCRIPT_WORD]


async def test_page_sends_security_headers(make_client: ClientFactory) -> None:
    client = await make_client()
    for response in (await client.get("/"), await client.post("/demo", data={"text": "no mask"})):
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Referrer-Policy"] == "no-referrer"


async def test_static_files_are_served_from_the_package_with_nosniff(make_client: ClientFactory) -> None:
    client = await make_client()
    page = Page(await (await client.get("/")).text())
    script = await client.get(page.scripts[0]["src"] or "")
    assert script.status == 200
    assert "javascript" in script.content_type
    assert script.headers["X-Content-Type-Options"] == "nosniff"
    css = await client.get("/static/demo.css")
    assert css.status == 200 and css.content_type == "text/css"
    # Every bar width the page can draw has its class (the CSP forbids inline styles).
    stylesheet = await css.text()
    assert all(f".w-{width} {{ width: {width}%; }}" in stylesheet for width in range(101))


async def test_raw_text_post_to_root_still_answers_json(make_client: ClientFactory) -> None:
    # Exactly the seed's curl: urlencoded content type, raw sentence body.
    client = await make_client()
    response = await client.post(
        "/", data=PARIS.encode(), headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert response.status == 200
    assert response.content_type == "application/json"
    body = await response.json()
    assert len(body) == 5 and body[0]["sequence"].startswith("paris is the")


async def test_form_body_sent_to_root_is_raw_text_not_decoded(make_client: ClientFactory) -> None:
    # The two routes never collide: the form's fields posted to / are filled in as they are.
    client = await make_client()
    response = await client.post("/", data={"text": "a [MASK] here", "top_k": "2"})
    assert response.status == 422  # "text=a+%5BMASK%5D+here&top_k=2" holds no literal [MASK]
    assert response.content_type == "application/json"
    raw = await client.post(
        "/", data=b"text=a [MASK] here&top_k=2", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    body = await raw.json()
    assert len(body) == 5  # the default top_k: top_k=2 was text, not a field
    as_json = await client.post("/", json={"inputs": "text=a [MASK] here&top_k=2"})
    assert body == await as_json.json()


async def test_get_demo_sends_the_browser_back_to_the_page(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.get("/demo", params={"text": "x [MASK]"}, allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/?text=x+%5BMASK%5D"


async def test_full_queue_is_shown_inline_as_busy(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=1)
    batcher = default_parts(client).batcher
    model.hold()
    loop = asyncio.get_running_loop()
    query = Query(input_ids=model.encode("a [MASK]"), top_k=1)
    running = batcher.enqueue(query, loop.time() + 60)
    try:
        await loop.run_in_executor(None, model.entered.wait, 10)
        waiting = batcher.enqueue(query, loop.time() + 60)  # fills the one queue slot
        response = await client.post("/demo", data={"text": "kept [MASK] text"})
        assert response.status == 503
        assert int(response.headers["Retry-After"]) >= 1
        page = Page(await response.text())
        assert "busy" in page.error
        assert page.textarea == "kept [MASK] text"
    finally:
        model.release()
    await asyncio.gather(running, waiting)


async def test_deadline_is_shown_inline_as_timeout(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    model.hold()
    try:
        response = await client.post("/demo", data={"text": "slow [MASK] text"}, headers={"X-Request-Timeout": "0.2"})
        assert response.status == 504
        page = Page(await response.text())
        assert "too long" in page.error
        assert page.textarea == "slow [MASK] text"
    finally:
        model.release()


async def test_bad_timeout_header_is_shown_inline(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo", data={"text": PARIS}, headers={"X-Request-Timeout": "soon"})
    assert response.status == 400
    page = Page(await response.text())
    assert "X-Request-Timeout" in page.error
    assert page.textarea == PARIS


async def test_a_server_of_one_model_shows_no_picker(make_client: ClientFactory) -> None:
    client = await make_client()
    page = Page(await (await client.get("/")).text())
    assert page.models == [] and page.posted_models == []


async def test_the_picker_follows_the_models_loaded_and_unloaded(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await make_client(
        model_repository=str(model_repository), model_control_mode="explicit", control_key=CONTROL_KEY
    )
    control = {"Authorization": f"Bearer {CONTROL_KEY}"}
    assert Page(await (await client.get("/")).text()).models == []  # one model: no picker
    assert (await client.post("/v2/repository/models/gamma/load", headers=control)).status == 200
    assert Page(await (await client.get("/")).text()).models == ["alpha", "gamma"]
    answered = await client.post("/demo", data={"text": PARIS, "model": "gamma"})
    assert answered.status == 200 and Page(await answered.text()).picked_model == "gamma"
    assert (await client.post("/v2/repository/models/gamma/unload", headers=control)).status == 200
    assert Page(await (await client.get("/")).text()).models == []
    gone = await client.post("/demo", data={"text": PARIS, "model": "gamma"})
    assert gone.status == 404 and "is not loaded" in Page(await gone.text()).error


@pytest.fixture
async def two_models(
    aiohttp_client: Any, bert_dir: Path, roberta_dir: Path
) -> TestClient[web.Request, web.Application]:
    settings = Settings(model=(f"bert={bert_dir}", f"rob={roberta_dir}"), warmup=False)
    client: TestClient[web.Request, web.Application] = await aiohttp_client(create_app(settings))
    return client


async def test_the_picker_lists_every_model_and_both_forms_post_the_chosen_one(
    two_models: TestClient[web.Request, web.Application],
) -> None:
    page = Page(await (await two_models.get("/")).text())
    assert page.models == ["bert", "rob"] and page.picked_model == "bert"
    assert page.posted_models == ["bert", "bert"]  # the fill-mask form and the scoring form
    assert page.texts_by_id["mask-token"] == "[MASK]"
    picked = Page(await (await two_models.get("/", params={"model": "rob"})).text())
    assert picked.picked_model == "rob" and picked.posted_models == ["rob", "rob"]
    assert picked.texts_by_id["mask-token"] == "<mask>"
    assert all("model=rob" in link and "%3Cmask%3E" in link for link in picked.example_links)


async def test_the_forms_answer_with_the_chosen_model_as_its_routes_do(
    two_models: TestClient[web.Request, web.Application],
) -> None:
    text = "paris is the <mask> of france."
    api = await (await two_models.post("/models/rob", json={"inputs": text, "parameters": {"top_k": 3}})).json()
    response = await two_models.post("/demo", data={"text": text, "top_k": "3", "model": "rob"})
    assert response.status == 200
    page = Page(await response.text())
    assert page.words == [p["token_str"] for p in api]
    assert page.picked_model == "rob"
    scored = await (await two_models.post("/models/rob/score", data="the dog barked.")).json()
    response = await two_models.post("/demo/score", data={"sentences": "the dog barked.", "model": "rob"})
    assert response.status == 200
    page = Page(await response.text())
    assert page.sentence_scores == [f"{scored['score']:.2f}"]
    # The same forms without a model answer with the first.
    default = await (await two_models.post("/demo", data={"text": "paris is the [MASK] of france."})).text()
    assert Page(default).picked_model == "bert"


async def test_an_unknown_model_is_shown_inline_naming_the_served_ones(
    two_models: TestClient[web.Request, web.Application],
) -> None:
    for response in (
        await two_models.get("/", params={"model": "gpt"}),
        await two_models.post("/demo", data={"text": PARIS, "model": "gpt"}),
    ):
        assert response.status == 404
        page = Page(await response.text())
        assert "No such model" in page.error and "'gpt'" in page.error and "'bert', 'rob'" in page.error
        assert page.picked_model == "bert"  # the page falls back to the default model
    response = await two_models.post("/demo/score", data={"sentences": "a dog.", "model": "gpt"})
    assert response.status == 404
    assert "'gpt'" in Page(await response.text()).score_error


async def test_a_text_longer_than_the_model_reads_is_answered_in_windows(make_client: ClientFactory) -> None:
    # The test model reads 128 tokens: a pasted text of three times that, masks at both ends.
    client = await make_client()
    text = LONG_TEXT
    api = await client.post("/", json={"inputs": text, "parameters": {"top_k": 2}})
    assert api.status == 200 and api.headers["X-Text-Windows"] == "2"
    response = await client.post("/demo", data={"text": text, "top_k": "2"})
    assert response.status == 200
    page = Page(await response.text())
    assert page.words == [p["token_str"] for mask in await api.json() for p in mask]
    assert len(page.marks) == 2 and page.textarea == text
    assert "Read in 2 windows" in page.texts_by_id["timing"]
