"""``POST /`` through the real app factory: raw text, the Inference API's JSON, and its clients."""

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

from .conftest import ClientFactory

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
