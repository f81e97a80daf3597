"""``POST /`` and ``POST /score`` through the real app factory: raw text, the Inference API's JSON, and its clients."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import huggingface_hub
import pytest
from aiohttp.test_utils import TestClient
from huggingface_hub import InferenceClient

from maskserve.engine import FillMaskEngine
from maskserve.model_api import Query
from maskserve.request.keys import SERVICE_KEY
from maskserve.serving.costs import BatchReport
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, holding, leave_once_queued, wait_until_entered

PARIS = "paris is the [MASK] of france."
SCORE_TOLERANCE = 1e-5


def assert_same_answers(got: Any, expected: Any) -> None:
    """Equal answers: same nesting, tokens, strings and sequences; scores within float noise.

    Scores may differ in the last bits when a text shares a padded batch with others.
    """
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        assert {k: v for k, v in got.items() if k != "score"} == {k: v for k, v in expected.items() if k != "score"}
        assert got["score"] == pytest.approx(expected["score"], abs=SCORE_TOLERANCE)
        return
    assert isinstance(got, list) and len(got) == len(expected), (got, expected)
    for got_item, expected_item in zip(got, expected):
        assert_same_answers(got_item, expected_item)


def direct(engine: FillMaskEngine, text: str, top_k: int = 5, targets: list[str] | None = None) -> Any:
    """What the engine answers for ``text`` alone, one list per mask."""
    target_ids = None if targets is None else engine.resolve_targets(targets)
    return engine.predict([Query(input_ids=engine.encode(text), top_k=top_k, target_ids=target_ids)])[0]


async def post_json(client: TestClient[Any, Any], document: Any) -> Any:
    response = await client.post("/", json=document)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_raw_text_answers_the_pipeline_list(make_client: ClientFactory, bert_engine: FillMaskEngine) -> None:
    client = await make_client()
    response = await client.post("/", data=PARIS.encode(), headers={"Content-Type": "text/plain"})
    assert response.status == 200
    assert response.content_type == "application/json"
    assert_same_answers(await response.json(), direct(bert_engine, PARIS)[0])


async def test_curl_form_body_is_filled_as_raw_text(make_client: ClientFactory, bert_engine: FillMaskEngine) -> None:
    # curl -d sends application/x-www-form-urlencoded; "a=b&c" must stay the sentence itself.
    text = "a=b&the [MASK]=dog"
    client = await make_client()
    response = await client.post("/", data=text.encode(), headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert response.status == 200
    assert_same_answers(await response.json(), direct(bert_engine, text)[0])


async def test_answer_carries_timing_and_request_headers(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/", data=PARIS.encode())
    assert response.status == 200
    for header in ("X-Queue-Time-Ms", "X-Inference-Time-Ms"):
        assert float(response.headers[header]) >= 0
    assert int(response.headers["X-Batch-Size"]) >= 1
    assert response.headers["X-Request-Id"]


async def test_json_string_input_answers_a_flat_list(make_client: ClientFactory, bert_engine: FillMaskEngine) -> None:
    client = await make_client()
    assert_same_answers(await post_json(client, {"inputs": PARIS}), direct(bert_engine, PARIS)[0])


async def test_json_list_of_one_text_answers_one_list_per_text(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    client = await make_client()
    body = await post_json(client, {"inputs": [PARIS]})
    assert len(body) == 1 and isinstance(body[0], list) and isinstance(body[0][0], dict)
    assert_same_answers(body, [direct(bert_engine, PARIS)[0]])


async def test_json_list_with_several_masks_answers_one_list_per_mask(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    texts = [PARIS, "the [MASK] and the [MASK] dog."]
    client = await make_client()
    body = await post_json(client, {"inputs": texts, "parameters": {"top_k": 2}})
    assert_same_answers(body, [direct(bert_engine, texts[0], 2)[0], direct(bert_engine, texts[1], 2)])
    assert len(body[1]) == 2 and len(body[1][0]) == 2


async def test_json_top_k_and_targets_pass_through(make_client: ClientFactory, bert_engine: FillMaskEngine) -> None:
    client = await make_client()
    body = await post_json(client, {"inputs": PARIS, "parameters": {"top_k": 2, "targets": ["dog", "city", "cat"]}})
    assert_same_answers(body, direct(bert_engine, PARIS, 2, ["dog", "city", "cat"])[0])
    assert {p["token_str"] for p in body} <= {"dog", "city", "cat"} and len(body) == 2
    single = await post_json(client, {"inputs": PARIS, "parameters": {"targets": "city"}})
    assert [p["token_str"] for p in single] == ["city"]


async def test_roberta_model_fills_its_own_mask(make_client: ClientFactory, roberta_engine: FillMaskEngine) -> None:
    text = "paris is the <mask> of france."
    client = await make_client(engine=roberta_engine)
    body = await post_json(client, {"inputs": text, "parameters": {"top_k": 3}})
    assert_same_answers(body, direct(roberta_engine, text, 3)[0])
    response = await client.post("/", data=PARIS.encode())
    assert response.status == 422
    error = await response.json()
    assert error["error_type"] == "no_mask_token" and "<mask>" in error["error"]


async def test_bad_inputs_answer_their_status_and_kind(make_client: ClientFactory) -> None:
    client = await make_client(max_top_k=10)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"data": b""}, 422, "invalid_input"),
        ({"data": b"  "}, 422, "invalid_input"),
        ({"data": b"no mask here"}, 422, "no_mask_token"),
        ({"data": b"\xff\xfe[MASK]"}, 400, "invalid_body"),
        ({"data": b"{oops", "headers": {"Content-Type": "application/json"}}, 400, "invalid_body"),
        # The standard library's header parser, under aiohttp, raises IndexError on this one.
        ({"data": PARIS.encode(), "headers": {"Content-Type": "text/plain; y*"}}, 400, "invalid_header"),
        ({"json": {"inputs": 5}}, 422, "invalid_input"),
        ({"json": {"inputs": PARIS, "parameters": {"top_k": 11}}}, 422, "invalid_input"),
        ({"json": {"inputs": PARIS, "parameters": {"targets": []}}}, 422, "invalid_input"),
        ({"json": {"inputs": PARIS, "surprise": True}}, 422, "invalid_input"),
    ]
    for kwargs, status, kind in cases:
        response = await client.post("/", **kwargs)
        assert response.status == status, kwargs
        body = await response.json()
        assert body["error_type"] == kind, kwargs
        assert body["request_id"] == response.headers["X-Request-Id"]
    # The server kept serving through all of them.
    assert (await client.post("/", data=PARIS.encode())).status == 200


async def test_text_over_the_limit_is_422(make_client: ClientFactory) -> None:
    client = await make_client(max_text_chars=20)
    response = await client.post("/", data=PARIS.encode())
    assert response.status == 422
    assert (await response.json())["error_type"] == "text_too_long"


def as_dicts(elements: list[Any]) -> list[dict[str, Any]]:
    return [{"score": e.score, "token": e.token, "token_str": e.token_str, "sequence": e.sequence} for e in elements]


@pytest.fixture
def hub_reaches_localhost(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The suite runs with HF_HUB_OFFLINE=1, which makes huggingface_hub refuse every URL."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    # huggingface_hub 0.x caches a session built for offline mode; 1.x reads the constant per call.
    reset = getattr(huggingface_hub.utils, "reset_sessions", None)
    if reset is not None:
        reset()
    yield
    monkeypatch.undo()
    if reset is not None:
        reset()


@pytest.mark.usefixtures("hub_reaches_localhost")
async def test_inference_client_fill_mask_works_unchanged(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    client = await make_client()
    hub = InferenceClient(base_url=str(client.make_url("/")))
    # InferenceClient is synchronous: run it off the event loop that serves it.
    plain = await asyncio.to_thread(hub.fill_mask, PARIS)
    assert_same_answers(as_dicts(plain), direct(bert_engine, PARIS)[0])
    chosen = await asyncio.to_thread(hub.fill_mask, PARIS, top_k=2, targets=["dog", "city", "cat"])
    assert len(chosen) == 2
    assert_same_answers(as_dicts(chosen), direct(bert_engine, PARIS, 2, ["dog", "city", "cat"])[0])


# POST /score: each text's pseudo-log-likelihood (minicons' agreement: tests/unit/tasks/test_pseudo_likelihood.py).


async def score_of(client: TestClient[Any, Any], **request: Any) -> Any:
    response = await client.post("/score", **request)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_score_raw_text_body_scores_that_one_text(make_client: ClientFactory) -> None:
    client = await make_client()
    raw = await score_of(client, data="the cat sleeps.", headers={"Content-Type": "text/plain"})
    assert raw == await score_of(client, json={"inputs": "the cat sleeps."})
    assert set(raw) == {"score", "windows"} and raw["score"] < 0 and raw["windows"] == 1


async def test_score_list_in_answers_a_list_in_order(make_client: ClientFactory) -> None:
    client = await make_client()
    texts = ["the cat sleeps.", "a dog", "paris is the capital of france."]
    alone = [await score_of(client, json={"inputs": text, "parameters": {"tokens": True}}) for text in texts]
    together = await score_of(client, json={"inputs": texts, "parameters": {"tokens": True}})
    assert len(together) == len(texts)
    for got, expected in zip(together, alone):
        assert [t["token"] for t in got["tokens"]] == [t["token"] for t in expected["tokens"]]
        assert got["score"] == pytest.approx(expected["score"], abs=1e-4)


async def test_score_tokens_name_every_scored_token_in_text_order(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    client = await make_client()
    answer = await score_of(client, json={"inputs": "the cat sleeps.", "parameters": {"tokens": True}})
    ids = bert_engine.encode("the cat sleeps.")[1:-1]  # without [CLS] and [SEP]
    assert [t["token"] for t in answer["tokens"]] == list(ids)
    assert [t["token_str"] for t in answer["tokens"]] == ["the", "cat", "sleeps", "."]
    assert answer["score"] == pytest.approx(sum(t["score"] for t in answer["tokens"]))


async def test_score_answers_a_paragraph_on_the_default_limits(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    """A 65-token sentence (the score benchmark's longest kind) and a text as long as the test model
    reads (128 tokens with its two special ones) are scored on the defaults, every token of each."""
    client = await make_client()
    for repeats, tokens in ((32, 65), (62, 125)):
        text = " ".join(["the cat"] * repeats) + " ."
        assert len(bert_engine.encode(text)) - 2 == tokens
        answer = await score_of(client, json={"inputs": text, "parameters": {"tokens": True}})
        assert len(answer["tokens"]) == tokens


@pytest.mark.parametrize(
    ("body", "field", "named"),
    [
        ({"inputs": "a dog", "parameters": {"metric": "l2r"}}, "parameters.metric", "original, within_word_l2r"),
        ({"inputs": "   "}, "inputs", "empty"),
        ({"inputs": ["a dog", ""]}, "inputs[1]", "empty"),
        ({"inputs": "the cat sleeps in the house."}, "inputs", "--max-score-tokens"),
        ({"inputs": "a dog", "parameters": {"top_k": 3}}, "parameters", "top_k"),
    ],
)
async def test_score_bad_requests_answer_422_naming_the_problem(
    make_client: ClientFactory, body: dict[str, Any], field: str, named: str
) -> None:
    client = await make_client(max_score_tokens=5)
    response = await client.post("/score", json=body)
    assert response.status == 422
    error = await response.json()
    assert error["field"] == field and named in error["error"]


async def test_score_copies_share_batches_with_fill_mask_and_leave_its_answers_unchanged(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model, max_batch_delay=0.05)
    model.hold()
    first = asyncio.create_task(client.post("/", data="a [MASK] b."))
    await wait_until_entered(model)
    # Queued behind the held pass, so both requests' texts are waiting when the next batch forms.
    scoring = asyncio.create_task(client.post("/score", json={"inputs": "the cat sleeps."}))
    filling = asyncio.create_task(client.post("/", data=PARIS))
    while default_parts(client).batcher.depth < 5:
        await asyncio.sleep(0.01)
    model.release()
    responses = await asyncio.gather(first, scoring, filling)
    assert [r.status for r in responses] == [200, 200, 200]
    assert_same_answers(await responses[2].json(), direct(bert_engine, PARIS)[0])
    assert any(len(batch) == 5 for batch in model.batches), model.batch_sizes()


async def test_score_is_admitted_on_the_cost_of_all_its_copies(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model, request_timeout=5.0)
    batcher = default_parts(client).batcher
    # Measured: a pass takes 0.1 s plus 10 ms a token.
    for tokens in (10, 20, 40):
        batcher.cost.observe(
            BatchReport(size=1, real_tokens=tokens, padded_tokens=tokens, seconds=0.1 + tokens * 0.01, failed=0)
        )
    # 30 copies of 32 tokens: about 10 s, though the text alone is one short pass.
    long_text = "the dog " * 15
    response = await client.post("/score", data=long_text)
    assert response.status == 422 and (await response.json())["error_type"] == "request_too_costly"
    # 8 copies of 10 tokens: about 1 s, fine for the server but not within the client's 0.3 s.
    short_text = "the dog " * 4
    response = await client.post("/score", data=short_text, headers={"X-Request-Timeout": "0.3"})
    assert response.status == 504
    assert model.batches == []
    assert (await client.post("/score", data=short_text)).status == 200


async def test_an_abandoned_score_request_costs_no_forward_pass(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model)
    batcher = default_parts(client).batcher
    async with holding(client, model, first="a [MASK] b.") as held:
        await leave_once_queued(client, "/score", 4, data="the cat sleeps.")  # its four copies
    assert (await held.busy).status == 200
    assert (await client.post("/", data=PARIS)).status == 200
    assert batcher.drops.abandoned == 4
    assert sum(len(batch) for batch in model.batches) == 2


@pytest.mark.parametrize(
    ("method", "path", "request_kwargs"),
    [
        ("POST", "/", {"data": PARIS}),
        ("POST", "/models/maskserve", {"data": PARIS}),
        ("POST", "/score", {"data": "the cat sleeps."}),
        (
            "POST",
            "/v2/models/maskserve/infer",
            {"json": {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [PARIS]}]}},
        ),
    ],
)
async def test_the_served_model_is_resolved_once_per_request(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, method: str, path: str, request_kwargs: dict[str, Any]
) -> None:
    """The door admits on the model it resolves, and the handler answers with that same one."""
    client = await make_client()
    service = client.app[SERVICE_KEY]
    resolved: list[str | None] = []
    real = service.served

    def counted(name: str | None = None) -> Any:
        resolved.append(name)
        return real(name)

    monkeypatch.setattr(service, "served", counted)
    response = await client.request(method, path, **request_kwargs)
    assert response.status == 200, await response.text()
    assert len(resolved) == 1, resolved
