"""Whole-word targets: the copies and their arithmetic, and ``POST /`` equal to a chain-rule oracle.

The oracle scores a target of k tokens with the Hugging Face model itself: for each i, the text
with t_1..t_{i-1} in place of the mask and t_i..t_k masked goes through the model, the logits at
t_i's position through a softmax over the vocabulary, and the product of the k probabilities is
the word's score. Single-token targets are held to ``transformers.pipeline("fill-mask")``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer

from maskserve.engine import FillMaskEngine
from maskserve.model_api import Prediction, Query, TextPredictions
from maskserve.service import served_model as service_module
from maskserve.serving.costs import BatchReport
from maskserve.tasks.fill_mask import FillMask
from maskserve.tasks.whole_words import Targets, plan_text, split_targets, text_predictions, word_copies
from maskserve.tasks.windows import Layout
from tests.conftest import ClientFactory, EngineOf
from tests.fakes import (
    ControlledModel,
    EchoModel,
    default_parts,
    holding,
    leave_once_queued,
)

# Absolute, in float32: torch runs the model's own kernels; the graph backends' fused kernels sum
# in another order (as in tests/unit/engine/test_fidelity.py).
# A model that reads 512 tokens, [CLS] and [SEP] around each text: every text planned here fits it.
LAYOUT = Layout(512, (1, 1))
TOLERANCE = {"torch": 1e-5, "onnxruntime": 1e-4, "openvino": 1e-4}
# Relative, in float32, on every backend: a wrong copy (a token of the word left in instead of
# masked) moves a word's score on these tiny models by 1e-4 of itself or more.
WORD_RELATIVE_TOLERANCE = 1e-5
# Per model: single-token targets, and whole words (each of several tokens on that model's
# tokenizer; a byte-level BPE target carries its leading space, as the pipeline reads it).
TARGETS = {
    "wordpiece": (["city", "dog"], ["cats", "parisian", "new city", "big dogs"]),
    "roberta": ([" city", " dog"], [" cats", " parisian", " new city", " big dogs"]),
}
ONE_MASK = "paris is the {m} of france."
TWO_MASKS = "the {m} is the {m} of france."


@functools.cache
def hf_model(folder: Path) -> tuple[Any, Any]:
    """The folder's tokenizer and masked-LM model in float32, straight from transformers."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return tokenizer, AutoModelForMaskedLM.from_pretrained(str(folder)).float().eval()


def word_ids(folder: Path, target: str) -> list[int]:
    tokenizer, _ = hf_model(folder)
    ids: list[int] = tokenizer(target, add_special_tokens=False)["input_ids"]
    return ids


def chain_rule(folder: Path, text: str, word: list[int], mask: int) -> float:
    """The word's score on the text's ``mask``-th mask, other masks left masked (module docstring)."""
    tokenizer, model = hf_model(folder)
    ids: list[int] = tokenizer(text)["input_ids"]
    position = [i for i, token in enumerate(ids) if token == tokenizer.mask_token_id][mask]
    k = len(word)
    score = torch.tensor(1.0)
    for i in range(k):
        filled = ids[:position] + word[:i] + [tokenizer.mask_token_id] * (k - i) + ids[position + 1 :]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([filled])).logits[0, position + i]
        score = score * logits.softmax(dim=-1)[word[i]]
    return float(score)


def filled_text(folder: Path, text: str, word: list[int], mask: int) -> str:
    """The text with the word in place of its ``mask``-th mask, decoded as the pipeline decodes a
    filled text (special tokens kept when the text has several masks)."""
    tokenizer, _ = hf_model(folder)
    ids: list[int] = tokenizer(text)["input_ids"]
    positions = [i for i, token in enumerate(ids) if token == tokenizer.mask_token_id]
    filled = ids[: positions[mask]] + word + ids[positions[mask] + 1 :]
    decoded: str = tokenizer.decode(filled, skip_special_tokens=len(positions) == 1)
    return decoded


@functools.cache
def pipeline(folder: Path) -> Any:
    return transformers.pipeline("fill-mask", model=str(folder), device="cpu")


def per_mask(answer: Any) -> list[list[dict[str, Any]]]:
    """The pipeline's (and the API's) one-mask answer is a flat list: one list per mask again."""
    return [answer] if answer and isinstance(answer[0], dict) else list(answer)


def assert_pipeline_equal(got: list[dict[str, Any]], expected: list[dict[str, Any]], tolerance: float) -> None:
    """The pipeline's own candidates: same keys, tokens, strings, sequences; scores within ``tolerance``."""
    assert [sorted(p) for p in got] == [sorted(p) for p in expected]
    assert [(p["token"], p["token_str"], p["sequence"]) for p in got] == [
        (p["token"], p["token_str"], p["sequence"]) for p in expected
    ]
    assert [p["score"] for p in got] == pytest.approx([p["score"] for p in expected], abs=tolerance)


async def fill(client: Any, document: dict[str, Any]) -> Any:
    response = await client.post("/", json=document)
    assert response.status == 200, await response.text()
    return await response.json()


# -- the copies and their arithmetic, without a model -------------------------------------------


def test_a_target_of_several_tokens_is_a_whole_word_unless_first_token_is_asked() -> None:
    names = ["city", "new city", "nothing", "city", "new city", "cats"]
    tokens = [(7,), (5, 7), (), (7,), (5, 7), (9, 3)]
    assert split_targets(names, tokens) == Targets((7,), ((5, 7), (9, 3)), ("new city", "cats"))
    assert split_targets(names, tokens, "first_token") == Targets((7, 5, 9), ())


def test_copy_i_puts_in_the_first_tokens_masks_the_rest_and_reads_its_own_row() -> None:
    # [CLS] a [MASK] b [MASK] [SEP], the word (7, 8, 9) on the first mask (position 2).
    copies = word_copies((1, 20, 4, 21, 4, 2), 4, 2, (7, 8, 9))
    assert [c.input_ids for c in copies] == [
        (1, 20, 4, 4, 4, 21, 4, 2),
        (1, 20, 7, 4, 4, 21, 4, 2),
        (1, 20, 7, 8, 4, 21, 4, 2),
    ]
    assert [(c.target_ids, c.answer_positions, c.top_k, c.predictions) for c in copies] == [
        ((7,), (2,), 1, 1),
        ((8,), (3,), 1, 1),
        ((9,), (4,), 1, 1),
    ]


def test_a_plan_holds_copies_mask_by_mask_word_by_word_and_skips_an_empty_own_query() -> None:
    text = (1, 4, 20, 4, 2)
    mixed = plan_text(Query(text, top_k=5, target_ids=(7,), n_masks=2), Targets((7,), ((5, 6), (8, 9, 10))), 4, LAYOUT)
    assert mixed.positions == (1, 3)
    assert [c.answer_positions[0] for c in mixed.copies if c.answer_positions] == [1, 2, 1, 2, 3, 3, 4, 3, 4, 5]
    assert mixed.queries[0].input_ids == text and len(mixed.queries) == 11
    assert mixed.answer_predictions == 2 * 3 and mixed.word_predictions == 2 * 2
    words_only = plan_text(Query(text, top_k=5, target_ids=(), n_masks=2), Targets((), ((5, 6),)), 4, LAYOUT)
    assert len(words_only.queries) == 4 and all(q.answer_positions is not None for q in words_only.queries)
    plain = plan_text(Query(text, top_k=5, n_masks=2), None, 4, LAYOUT)
    assert plain.queries == (plain.query,) and not plain.has_words


def one(token: int, score: float) -> TextPredictions:
    return [[Prediction(score=score, token=token, token_str=str(token), sequence="")]]


def test_a_words_score_is_the_product_merged_by_score_and_cut_to_top_k() -> None:
    text = (1, 4, 2)
    plan = plan_text(Query(text, top_k=2, target_ids=(7, 8), n_masks=1), Targets((7, 8), ((5, 6), (9, 3))), 4, LAYOUT)
    own: TextPredictions = [
        [
            Prediction(score=0.3, token=7, token_str="seven", sequence="s7"),
            Prediction(score=0.1, token=8, token_str="eight", sequence="s8"),
        ]
    ]
    answers = [own, one(5, 0.8), one(6, 0.5), one(9, 0.5), one(3, 0.5)]
    decoded: list[tuple[int, ...]] = []

    def fill_word(ids: Any, position: int, word: Any) -> tuple[str, str]:
        decoded.append(tuple(word))
        return "-".join(map(str, word)), f"text with {tuple(word)} at {position}"

    (result,) = text_predictions(plan, answers, fill_word)
    assert [p["score"] for p in result] == pytest.approx([0.8 * 0.5, 0.3])
    assert [{k: v for k, v in p.items() if k != "score"} for p in result] == [
        {"token": 5, "token_str": "5-6", "sequence": "text with (5, 6) at 1", "tokens": [5, 6]},
        {"token": 7, "token_str": "seven", "sequence": "s7"},
    ]
    assert decoded == [(5, 6)], "a word cut by top_k is never decoded"


def test_a_copy_answered_for_another_token_is_a_bug_not_an_answer() -> None:
    plan = plan_text(Query((1, 4, 2), top_k=2, target_ids=(), n_masks=1), Targets((), ((5, 6),)), 4, LAYOUT)
    with pytest.raises(RuntimeError, match="this is a bug"):
        text_predictions(plan, [one(5, 0.5), one(7, 0.5)], lambda ids, position, word: ("", ""))


# -- through the real app: the oracle, the pipeline ---------------------------------------------


@pytest.mark.parametrize("model", ["wordpiece", "roberta"])
async def test_whole_words_equal_the_chain_rule_and_single_tokens_the_pipeline(
    make_client: ClientFactory, engine_of: EngineOf, backend: str, request: pytest.FixtureRequest, model: str
) -> None:
    engine = engine_of(model)
    assert engine.describe()["read_rows_last_layer"] == "yes"
    folder: Path = request.getfixturevalue(f"{model}_dir")
    singles, words = TARGETS[model]
    assert all(len(word_ids(folder, w)) > 1 for w in words), "a test word is one token: it would prove nothing"
    assert all(len(word_ids(folder, s)) == 1 for s in singles)
    client = await make_client(engine=engine)
    for template in (ONE_MASK, TWO_MASKS):
        text = template.format(m=engine.mask_token)
        body = {"inputs": text, "parameters": {"top_k": 10, "targets": singles + words}}
        answer = per_mask(await fill(client, body))
        alone = per_mask(pipeline(folder)(text, targets=singles, top_k=10))
        assert len(answer) == len(alone) == template.count("{m}")
        for mask, (candidates, expected_singles) in enumerate(zip(answer, alone)):
            assert len(candidates) == len(singles) + len(words)
            scores = [p["score"] for p in candidates]
            assert scores == sorted(scores, reverse=True)
            # The single tokens: exactly the pipeline's candidates, in its order, without "tokens".
            assert_pipeline_equal([p for p in candidates if "tokens" not in p], expected_singles, TOLERANCE[backend])
            by_word = {tuple(p["tokens"]): p for p in candidates if "tokens" in p}
            for target in words:
                ids = word_ids(folder, target)
                got = by_word[tuple(ids)]
                where = f"{model} {backend} {target!r} on mask {mask} of {text!r}"
                want = chain_rule(folder, text, ids, mask)
                # A product of several small probabilities is itself small: within the absolute
                # bound, and within float32 noise of the oracle relative to its size.
                assert got["score"] == pytest.approx(want, abs=TOLERANCE[backend]), where
                assert got["score"] == pytest.approx(want, rel=WORD_RELATIVE_TOLERANCE, abs=0), where
                assert got["token"] == ids[0], where
                assert got["token_str"] == hf_model(folder)[0].decode(ids), where
                assert got["sequence"] == filled_text(folder, text, ids, mask), where


@pytest.mark.parametrize("model", ["wordpiece", "roberta"])
async def test_first_token_answers_exactly_as_the_pipeline(
    make_client: ClientFactory, request: pytest.FixtureRequest, model: str
) -> None:
    engine: FillMaskEngine = request.getfixturevalue(f"{model}_engine")
    folder: Path = request.getfixturevalue(f"{model}_dir")
    singles, words = TARGETS[model]
    client = await make_client(engine=engine)
    for template in (ONE_MASK, TWO_MASKS):
        text = template.format(m=engine.mask_token)
        parameters = {"top_k": 4, "targets": words + singles, "multi_token_targets": "first_token"}
        answer = per_mask(await fill(client, {"inputs": text, "parameters": parameters}))
        expected = per_mask(pipeline(folder)(text, targets=words + singles, top_k=4))
        for got, want in zip(answer, expected, strict=True):
            assert_pipeline_equal(got, want, TOLERANCE["torch"])


async def test_texts_sent_together_and_requests_sent_at_once_each_get_their_own_answer(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine, max_batch_delay=0.02)
    texts = [ONE_MASK.format(m="[MASK]"), TWO_MASKS.format(m="[MASK]"), "a small [MASK] sleeps."]
    target_sets = [["city", "cats"], ["big dogs", "dog", "parisian"], ["new city"]]
    alone = {
        (text, tuple(targets)): await fill(client, {"inputs": text, "parameters": {"top_k": 3, "targets": targets}})
        for text in texts
        for targets in target_sets
    }
    bodies = [{"inputs": texts, "parameters": {"top_k": 3, "targets": targets}} for targets in target_sets]
    together = await asyncio.gather(*(fill(client, body) for body in bodies * 3))
    for body, answer in zip(bodies * 3, together, strict=True):
        expected = [alone[(text, tuple(body["parameters"]["targets"]))] for text in texts]
        assert strip_scores(answer) == strip_scores(expected)
        assert flat_scores(answer) == pytest.approx(flat_scores(expected), rel=WORD_RELATIVE_TOLERANCE, abs=1e-7)


async def test_many_words_are_decoded_off_the_event_loop_with_the_same_answer(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await make_client(engine=wordpiece_engine)
    body = {"inputs": TWO_MASKS.format(m="[MASK]"), "parameters": {"targets": ["city", "cats", "new city"]}}
    inline = await fill(client, body)
    monkeypatch.setattr(service_module, "INLINE_DECODE_TOKENS", 0)
    on_the_thread = asyncio.get_running_loop().run_in_executor
    threads: list[object] = []

    def spy(executor: Any, function: Any, *args: Any) -> Any:
        threads.append(function)
        return on_the_thread(executor, function, *args)

    monkeypatch.setattr(asyncio.get_running_loop(), "run_in_executor", spy)
    assert strip_scores(await fill(client, body)) == strip_scores(inline)
    assert FillMask.fold in [getattr(function, "__func__", function) for function in threads]


def strip_scores(answer: Any) -> Any:
    if isinstance(answer, dict):
        return {k: v for k, v in answer.items() if k != "score"}
    return [strip_scores(item) for item in answer]


def flat_scores(answer: Any) -> list[float]:
    if isinstance(answer, dict):
        return [answer["score"]]
    return [score for item in answer for score in flat_scores(item)]


async def test_a_single_token_request_answers_the_same_bytes_in_either_mode(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine)
    body: dict[str, Any] = {"inputs": ONE_MASK.format(m="[MASK]"), "parameters": {"targets": ["city", "dog"]}}
    default = await (await client.post("/", json=body)).read()
    body["parameters"]["multi_token_targets"] = "first_token"
    assert await (await client.post("/", json=body)).read() == default
    assert b'"tokens"' not in default


async def test_the_open_inference_protocol_takes_the_same_parameter(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine, model_name="m")
    text = ONE_MASK.format(m="[MASK]")
    expected = {
        mode: await fill(
            client, {"inputs": [text], "parameters": {"targets": ["city", "cats"], "multi_token_targets": mode}}
        )
        for mode in ("whole_word", "first_token")
    }
    assert expected["whole_word"] != expected["first_token"]
    for mode, answer in expected.items():
        infer = {
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
            "parameters": {"targets": "city,cats", "multi_token_targets": mode},
        }
        response = await client.post("/v2/models/m/infer", json=infer)
        assert response.status == 200, await response.text()
        output = (await response.json())["outputs"][0]["data"][0]
        got = [{k: v for k, v in p.items() if k != "score"} for p in json.loads(output)]
        assert got == [{k: v for k, v in p.items() if k != "score"} for p in answer[0]]


# -- bounds: limits, admission, abandonment ------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "settings", "named", "field"),
    [
        ({"targets": ["a b c d"]}, {"max_word_copies": 7}, "--max-word-copies", "parameters.targets"),
        ({"targets": ["a b c d e"]}, {"max_word_copies": 64, "max_queue": 9}, "--max-queue", "parameters.targets"),
        (
            {"targets": ["a " * 600]},
            {"max_word_copies": 9999, "max_queue": 9999},
            "a whole word may take at most 256",
            "parameters.targets",
        ),
        ({"targets": ["a bb", "ccc d"]}, {"max_predictions": 12}, "24 of them for whole-word targets", None),
        (
            {"targets": "a b", "multi_token_targets": "x"},
            {},
            "whole_word, first_token",
            "parameters.multi_token_targets",
        ),
    ],
)
async def test_whole_words_past_a_limit_are_422_before_any_model_work(
    make_client: ClientFactory, parameters: dict[str, Any], settings: dict[str, Any], named: str, field: str | None
) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, **settings)
    # Two texts of two masks: 2 x 2 x k copies of a word of k tokens.
    body = {"inputs": ["[MASK] x [MASK]", "y [MASK] [MASK]"], "parameters": parameters}
    response = await client.post("/", json=body)
    assert response.status == 422, await response.text()
    error = await response.json()
    assert named in error["error"] and error.get("field") == field
    assert model.batches == []


async def test_the_same_limits_let_a_request_at_their_edge_through(make_client: ClientFactory) -> None:
    client = await make_client(engine=EchoModel(), max_word_copies=16, max_queue=18)
    body = {"inputs": ["[MASK] x [MASK]", "y [MASK] [MASK]"], "parameters": {"targets": ["a b c d", "e"]}}
    answer = await fill(client, body)
    assert [[len(mask) for mask in text] for text in answer] == [[2, 2], [2, 2]]


async def test_a_words_copies_run_in_the_same_pass_as_its_text(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    model = ControlledModel(wordpiece_engine)
    client = await make_client(engine=model)
    await fill(client, {"inputs": ONE_MASK.format(m="[MASK]"), "parameters": {"targets": ["city", "big dogs"]}})
    assert model.batch_sizes() == [1 + 3]


async def test_whole_words_are_admitted_on_the_cost_of_all_their_copies(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    model = ControlledModel(wordpiece_engine)
    client = await make_client(engine=model, request_timeout=5.0)
    batcher = default_parts(client).batcher
    # Measured: a pass takes 0.1 s plus 10 ms a token.
    for tokens in (10, 20, 40):
        batcher.cost.observe(
            BatchReport(size=1, real_tokens=tokens, padded_tokens=tokens, seconds=0.1 + tokens * 0.01, failed=0)
        )
    text = "the dog " * 15 + "[MASK]"  # 33 tokens: the text alone is one short pass
    # With a word of 12 tokens, 12 copies of 44 tokens more: about 6 s, more than the server allows.
    word = "big " * 12
    response = await client.post("/", json={"inputs": text, "parameters": {"targets": ["dog", word]}})
    assert response.status == 422 and (await response.json())["error_type"] == "request_too_costly"
    # With a word of 6 tokens: about 3 s, fine for the server but not within the client's 2 s.
    body: dict[str, Any] = {"inputs": text, "parameters": {"targets": ["dog", "big " * 6]}}
    assert (await client.post("/", json=body, headers={"X-Request-Timeout": "2"})).status == 504
    assert model.batches == []
    body["parameters"]["targets"] = ["dog"]
    assert (await client.post("/", json=body, headers={"X-Request-Timeout": "2"})).status == 200


async def test_an_abandoned_whole_word_request_costs_no_forward_pass(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    model = ControlledModel(wordpiece_engine)
    client = await make_client(engine=model)
    batcher = default_parts(client).batcher
    body = {"inputs": ONE_MASK.format(m="[MASK]"), "parameters": {"targets": ["city", "big dogs"]}}
    async with holding(client, model, first="a [MASK] b.") as held:
        await leave_once_queued(client, "/", 4, json=body)  # its own query and the word's three copies
    assert (await held.busy).status == 200
    assert (await client.post("/", data="a [MASK] b.")).status == 200
    assert batcher.drops.abandoned == 4
    assert sum(len(batch) for batch in model.batches) == 2
