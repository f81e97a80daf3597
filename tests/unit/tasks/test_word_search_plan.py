"""``parameters.whole_words`` through the real app: the search's rounds through the queue, its
answer in the whole-word targets' shape, equal to those targets' scores, and its refusals."""

from __future__ import annotations

from typing import Any

import pytest

from maskserve.engine import FillMaskEngine
from maskserve.model_api import Query
from maskserve.tasks.word_search import rows_bound
from tests.conftest import ClientFactory


async def post(client: Any, document: dict[str, Any], status: int = 200) -> Any:
    response = await client.post("/", json=document)
    assert response.status == status, await response.text()
    return await response.json()


@pytest.mark.parametrize("model", ["wordpiece", "roberta", "xlmr"])
async def test_whole_words_answer_words_of_several_pieces_scored_as_their_targets(
    make_client: ClientFactory, model: str, request: pytest.FixtureRequest
) -> None:
    engine: FillMaskEngine = request.getfixturevalue(f"{model}_engine")
    client = await make_client(engine=engine, max_top_k=1000)
    text = f"the {engine.mask_token} sat on the house ."
    top_k = len(engine.word_pieces().starts) + 10
    answer = await post(client, {"inputs": text, "parameters": {"whole_words": True, "top_k": top_k}})
    assert len(answer) == top_k
    scores = [p["score"] for p in answer]
    assert scores == sorted(scores, reverse=True)
    several = [p for p in answer if len(p["tokens"]) > 1]
    assert several, "past every one-piece word, words of several pieces are ranked in"
    # The same words sent as targets score the same (the chain rule, the same copies).
    word = several[0]
    targeted = await post(client, {"inputs": text, "parameters": {"targets": [word["token_str"]], "top_k": 1}})
    assert targeted[0]["tokens"] == word["tokens"]
    assert targeted[0]["score"] == pytest.approx(word["score"], rel=1e-6)
    assert targeted[0]["sequence"] == word["sequence"] and word["token"] == word["tokens"][0]
    # A one-piece word's score is the plain fill's.
    plain = await post(client, {"inputs": text, "parameters": {"top_k": len(engine.tokenizer)}})
    by_token = {p["token"]: p["score"] for p in plain}
    for prediction in answer:
        if len(prediction["tokens"]) == 1:
            assert prediction["score"] == pytest.approx(by_token[prediction["token"]], rel=1e-6)


async def test_several_texts_and_masks_each_get_their_own_search(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine)
    texts = ["the [MASK] sat on the [MASK] .", "[MASK] is the capital of france ."]
    answer = await post(client, {"inputs": texts, "parameters": {"whole_words": True, "top_k": 3}})
    assert [len(a) for a in answer] == [2, 3]
    assert all(len(mask) == 3 for mask in answer[0])
    for text, text_answer in zip(texts, answer):
        alone = await post(client, {"inputs": text, "parameters": {"whole_words": True, "top_k": 3}})
        # Read alone, the same words (scores within float32 noise: a padded batch sums in another order).
        masks = [text_answer] if isinstance(text_answer[0], dict) else text_answer
        alone_masks = [alone] if isinstance(alone[0], dict) else alone
        for got, want in zip(masks, alone_masks, strict=True):
            assert [p["tokens"] for p in got] == [p["tokens"] for p in want]
            assert [p["score"] for p in got] == pytest.approx([p["score"] for p in want], rel=1e-5)


async def test_without_whole_words_every_answer_is_unchanged(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine)
    body = {"inputs": "the [MASK] sat .", "parameters": {"top_k": 4}}
    off = {"inputs": "the [MASK] sat .", "parameters": {"top_k": 4, "whole_words": False}}
    assert await post(client, body) == await post(client, off)
    assert all("tokens" not in p for p in await post(client, body))


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ({"whole_words": True, "targets": ["cat"]}, "parameters.whole_words"),
        ({"whole_words": True, "max_word_pieces": 0}, "parameters.max_word_pieces"),
        ({"whole_words": True, "max_word_pieces": 7}, "parameters.max_word_pieces"),
        ({"whole_words": True, "word_beam": 0}, "parameters.word_beam"),
        ({"whole_words": "yes"}, "parameters.whole_words"),
    ],
)
async def test_bad_whole_word_parameters_are_422_naming_them(
    make_client: ClientFactory, parameters: dict[str, Any], field: str
) -> None:
    client = await make_client()
    response = await client.post("/", json={"inputs": "the [MASK] sat .", "parameters": parameters})
    assert response.status in (400, 422)
    assert field.split(".")[-1] in await response.text()


async def test_a_search_past_the_queue_is_refused_before_any_work(make_client: ClientFactory) -> None:
    client = await make_client(max_queue=40)
    response = await client.post(
        "/", json={"inputs": "the [MASK] sat .", "parameters": {"whole_words": True, "word_beam": 16}}
    )
    assert rows_bound(3, 16) > 40
    assert response.status == 422 and "word_beam" in await response.text()


LONG_TAIL = "the cat sat . " * 40


@pytest.mark.parametrize("model", ["wordpiece", "roberta"])
async def test_a_text_longer_than_the_model_reads_is_searched_in_windows_scored_as_its_targets(
    make_client: ClientFactory, model: str, request: pytest.FixtureRequest
) -> None:
    engine: FillMaskEngine = request.getfixturevalue(f"{model}_engine")
    client = await make_client(engine=engine, max_top_k=1000)
    mask = engine.mask_token
    # A mask at each end, far apart: each is read in a window of its own.
    text = f"the {mask} sat on the house . {LONG_TAIL}the {mask} ran home ."
    assert len(engine.encode(text)) > engine.max_tokens
    top_k = len(engine.word_pieces().starts) + 5
    answer = await post(client, {"inputs": text, "parameters": {"whole_words": True, "top_k": top_k}})
    assert len(answer) == 2 and all(len(words) == top_k for words in answer)
    several = [[p for p in words if len(p["tokens"]) > 1] for words in answer]
    assert all(several), "past every one-piece word, words of several pieces are ranked in"
    # Each word scores as it does as a target of the same text: read in the same windows.
    names = [several[0][0]["token_str"], several[1][0]["token_str"], answer[0][0]["token_str"]]
    targeted = await post(client, {"inputs": text, "parameters": {"targets": names, "top_k": 3}})
    matched = []
    for words, targets in zip(answer, targeted, strict=True):
        found = {tuple(p["tokens"]): p for p in words}
        both = [(found[key], t) for t in targets if (key := tuple(t.get("tokens", [t["token"]]))) in found]
        for word, target in both:
            assert word["score"] == pytest.approx(target["score"], rel=1e-5)
            assert word["sequence"] == target["sequence"]
        matched.append(len(both))
    # The first mask's own two words, the second's one.
    assert matched[0] >= 2 and matched[1] >= 1
    # A one-piece word's score is the plain fill's, which reads the same windows.
    plain = await post(client, {"inputs": text, "parameters": {"top_k": len(engine.tokenizer)}})
    for words, fills in zip(answer, plain, strict=True):
        by_token = {p["token"]: p["score"] for p in fills}
        singles = [p for p in words if len(p["tokens"]) == 1]
        assert singles
        for prediction in singles:
            assert prediction["score"] == pytest.approx(by_token[prediction["token"]], rel=1e-5)


async def test_a_long_text_asked_not_to_be_windowed_is_refused_naming_long_text(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine)
    # The text fits the model; with a word of three pieces in place of its mask, it would not.
    tail = LONG_TAIL
    while len(wordpiece_engine.encode("the [MASK] sat . " + tail)) + 2 <= wordpiece_engine.max_tokens:
        tail += "the cat sat . "
    text = "the [MASK] sat . " + tail
    while len(wordpiece_engine.encode(text)) > wordpiece_engine.max_tokens:
        text = text[: text.rindex(" the cat")] + " ."
    assert len(wordpiece_engine.encode(text)) + 2 > wordpiece_engine.max_tokens
    parameters = {"whole_words": True, "long_text": "refuse"}
    response = await client.post("/", json={"inputs": text, "parameters": parameters})
    assert response.status == 422 and "long_text" in await response.text()
    windowed = await client.post("/", json={"inputs": text, "parameters": {"whole_words": True}})
    assert windowed.status == 200, await windowed.text()


async def test_the_rounds_run_through_the_batcher_and_are_admitted_once_on_their_bound(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    original = FillMaskEngine.predict

    def counting(self: FillMaskEngine, queries: list[Query], progress: Any = None) -> Any:
        seen.append(len(queries))
        return original(self, queries, progress)

    monkeypatch.setattr(type(wordpiece_engine), "predict", counting)
    client = await make_client(engine=wordpiece_engine)
    await post(client, {"inputs": "the [MASK] sat .", "parameters": {"whole_words": True, "top_k": 2}})
    # Round 0 asks one row per length; later rounds only what the beam and the bound keep.
    assert seen[0] == 3 and 1 <= len(seen) <= 3 and sum(seen) <= rows_bound(3, 16)
