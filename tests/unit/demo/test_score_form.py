"""The demo page's scoring form over HTTP, through the real app factory (the browser tests live in
tests/system/browser/): what it shows equals what ``POST /score`` answers, and each refusal is shown inline."""

from __future__ import annotations

import asyncio

from maskserve.demo.score_form import LOG_PROB_FLOOR, bar_width, nats
from maskserve.model_api import Query
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts
from tests.unit.demo.test_page import Page


def test_bars_are_full_for_a_certain_token_and_a_sliver_at_the_floor_or_below() -> None:
    assert bar_width(0.0) == 100
    assert bar_width(LOG_PROB_FLOOR / 2) == 50
    assert bar_width(LOG_PROB_FLOOR) == bar_width(10 * LOG_PROB_FLOOR) == 1
    assert bar_width(-1.7976931348623157e308) == 1


def test_a_probability_that_underflowed_is_shown_as_minus_infinity() -> None:
    # scoring.py writes it as the most negative float, so that the API's JSON stays valid.
    assert nats(-1.7976931348623157e308) == "-inf" and nats(float("-inf")) == "-inf"
    assert nats(-1.234) == "-1.23"


SENTENCES = ["the cat sat on the mat.", "unbelievably, the dog barked."]


async def test_page_shows_an_empty_scoring_form_with_the_default_metric(make_client: ClientFactory) -> None:
    client = await make_client()
    page = Page(await (await client.get("/")).text())
    assert page.sentences == "" and page.selected_metric == "original"
    assert page.score_error_hidden and page.sentence_scores == []
    assert "64 sentences of 4096 tokens each, 4096 tokens in all" in " ".join(
        page.texts_by_id["sentences-help"].split()
    )


async def test_score_form_shows_what_post_score_answers_with_a_bar_per_token(make_client: ClientFactory) -> None:
    client = await make_client()
    for metric in ("original", "within_word_l2r"):
        request = {"inputs": SENTENCES, "parameters": {"metric": metric, "tokens": True}}
        api = await (await client.post("/score", json=request)).json()
        typed = "\n".join(SENTENCES)
        response = await client.post("/demo/score", data={"sentences": typed, "metric": metric})
        assert response.status == 200
        assert response.headers["Cache-Control"] == "no-store"
        assert {"X-Queue-Time-Ms", "X-Inference-Time-Ms", "X-Batch-Size"} <= set(response.headers)
        page = Page(await response.text())
        assert page.scored_sentences == SENTENCES
        assert page.sentence_scores == [f"{text['score']:.2f}" for text in api]
        tokens = [token for text in api for token in text["tokens"]]
        assert page.score_tokens == [token["token_str"] for token in tokens]
        assert page.log_probs == [f"{token['score']:.2f}" for token in tokens]
        # One bar per token, longer for a likelier token, never empty.
        assert len(page.bar_widths) == len(tokens) and all(1 <= width <= 100 for width in page.bar_widths)
        by_likelihood = [w for _, w in sorted(zip([t["score"] for t in tokens], page.bar_widths))]
        assert by_likelihood == sorted(by_likelihood)
        assert page.sentences == typed and page.selected_metric == metric
        assert page.score_error_hidden and page.words == []


async def test_score_form_skips_blank_lines(make_client: ClientFactory) -> None:
    client = await make_client()
    typed = f"\n{SENTENCES[0]}\n\n   \n{SENTENCES[1]}\n"
    page = Page(await (await client.post("/demo/score", data={"sentences": typed})).text())
    assert page.scored_sentences == SENTENCES
    assert page.sentences == typed


async def test_empty_score_form_is_shown_inline(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo/score", data={"sentences": " \n  ", "metric": "within_word_l2r"})
    assert response.status == 422
    page = Page(await response.text())
    assert not page.score_error_hidden and "The list of sentences must not be empty" in page.score_error
    assert page.sentences_attrs["aria-invalid"] == "true"
    assert page.sentences == " \n  " and page.selected_metric == "within_word_l2r"
    assert page.error_hidden  # the fill-mask form's own error box stays empty
    assert default_parts(client).batcher.scheduler.batches_run == 0


async def test_too_many_sentences_are_shown_inline(make_client: ClientFactory) -> None:
    client = await make_client(max_inputs=2)
    typed = "\n".join(["one.", "two.", "three."])
    response = await client.post("/demo/score", data={"sentences": typed})
    assert response.status == 422
    page = Page(await response.text())
    assert "The list of sentences holds more than 2 items" in page.score_error
    assert page.sentences == typed
    assert default_parts(client).batcher.scheduler.batches_run == 0


async def test_a_sentence_over_the_score_token_limit_is_named_by_its_number(make_client: ClientFactory) -> None:
    client = await make_client(max_score_tokens=4)
    response = await client.post("/demo/score", data={"sentences": "short.\nthis one is far too long to score."})
    assert response.status == 422
    page = Page(await response.text())
    assert "Sentence 2 has 9 tokens" in page.score_error and "--max-score-tokens" in page.score_error
    assert page.sentences_attrs["aria-invalid"] == "true"


async def test_unknown_metric_marks_the_metric_field(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo/score", data={"sentences": SENTENCES[0], "metric": "l2r"})
    assert response.status == 422
    page = Page(await response.text())
    assert "Check the metric" in page.score_error and "within_word_l2r" in page.score_error
    assert page.metric_attrs["aria-invalid"] == "true"
    assert "aria-invalid" not in page.sentences_attrs
    assert page.sentences == SENTENCES[0]


async def test_script_sentence_is_escaped_in_the_box_and_the_scores(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/demo/score", data={"sentences": "<script>alert(1)</script>"})
    assert response.status == 200
    html = await response.text()
    assert "<script>alert(1)" not in html
    page = Page(html)
    assert page.sentences == "<script>alert(1)</script>"
    assert page.scored_sentences == ["<script>alert(1)</script>"]


async def test_full_queue_is_shown_inline_on_the_score_form(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=8, max_score_tokens=8, max_inputs=8)
    batcher = default_parts(client).batcher
    model.hold()
    loop = asyncio.get_running_loop()
    query = Query(input_ids=model.encode("a [MASK]"), top_k=1)
    running = batcher.enqueue(query, loop.time() + 60)
    try:
        await loop.run_in_executor(None, model.entered.wait, 10)
        waiting = [batcher.enqueue(query, loop.time() + 60) for _ in range(6)]  # 2 of 8 slots left
        response = await client.post("/demo/score", data={"sentences": "one two three", "metric": "original"})
        assert response.status == 503
        assert int(response.headers["Retry-After"]) >= 1
        page = Page(await response.text())
        assert "busy" in page.score_error
        assert page.sentences == "one two three"
    finally:
        model.release()
    await asyncio.gather(running, *waiting)


async def test_deadline_is_shown_inline_on_the_score_form(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    model.hold()
    try:
        response = await client.post(
            "/demo/score", data={"sentences": SENTENCES[0]}, headers={"X-Request-Timeout": "0.2"}
        )
        assert response.status == 504
        page = Page(await response.text())
        assert "too long" in page.score_error
        assert page.sentences == SENTENCES[0]
    finally:
        model.release()


async def test_get_demo_score_sends_the_browser_back_to_the_page(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.get("/demo/score", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/"


async def test_a_sentence_longer_than_the_model_reads_is_scored_in_windows(make_client: ClientFactory) -> None:
    client = await make_client(max_score_tokens=512)
    long = "the dog ran in the park. " * 40
    api = await (await client.post("/score", json={"inputs": [long.strip(), SENTENCES[0]]})).json()
    assert [text["windows"] for text in api] == [5, 1]
    response = await client.post("/demo/score", data={"sentences": f"{long}\n{SENTENCES[0]}", "metric": "original"})
    assert response.status == 200
    page = Page(await response.text())
    assert page.sentence_scores == [f"{text['score']:.2f}" for text in api]
    assert "read in 5 windows" in await response.text()
