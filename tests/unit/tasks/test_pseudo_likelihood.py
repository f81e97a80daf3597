"""Pseudo-log-likelihood scoring: masked copies, and ``POST /score`` equal to a minicons-style oracle.

The oracle does what minicons' ``MaskedLMScorer`` does, with the Hugging Face model itself: every
token but padding and the CLS/SEP (``<s>``/``</s>``) ones is masked in turn (``within_word_l2r``:
with the tokens of its word to its right), the logits at its position go through ``log_softmax``
over the vocabulary, and the true token's value is its score; the text's score is their sum.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from maskserve.tasks.pseudo_likelihood import (
    LOWEST_SCORE,
    masked_copies,
    masked_positions,
    scored_positions,
    text_score,
    text_scores,
)
from maskserve.tasks.windows import Layout
from tests.conftest import ClientFactory, EngineOf

TEXTS = [
    "paris is the capital of france.",
    "the parisian cats sleeps in londoners house.",
    "a small dog runs.",
]
# The tolerance the issue asks of every backend, in float32.
TOLERANCE = 1e-4
# A model that reads 512 tokens, [CLS] and [SEP] around each text: every text here fits it.
LAYOUT = Layout(512, (1, 1))
MODELS = ("wordpiece", "roberta", "xlmr")


@functools.cache
def hf_model(folder: Path) -> tuple[Any, Any]:
    """The folder's tokenizer and masked-LM model in float32, straight from transformers."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    # float32 as built; the loading keyword for a dtype differs across the supported transformers.
    return tokenizer, AutoModelForMaskedLM.from_pretrained(str(folder)).float().eval()


def oracle(folder: Path, text: str, metric: str) -> list[float]:
    """Each scored token's log-probability, as minicons computes it (see the module docstring)."""
    tokenizer, model = hf_model(folder)
    encoding = tokenizer(text)
    ids: list[int] = encoding["input_ids"]
    word_ids = encoding.word_ids()
    skipped = {tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id}
    scores = []
    for position, token in enumerate(ids):
        if token in skipped:
            continue
        masked = list(ids)
        masked[position] = tokenizer.mask_token_id
        if metric == "within_word_l2r":
            after = position + 1
            while after < len(ids) and word_ids[after] is not None and word_ids[after] == word_ids[position]:
                masked[after] = tokenizer.mask_token_id
                after += 1
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([masked])).logits[0, position]
        scores.append(float(logits.log_softmax(dim=-1)[token]))
    return scores


def model_dir(name: str, request: pytest.FixtureRequest) -> Path:
    folder: Path = request.getfixturevalue(f"{name}_dir")
    return folder


@pytest.mark.parametrize("metric", ["original", "within_word_l2r"])
@pytest.mark.parametrize("model", MODELS)
async def test_score_equals_the_minicons_oracle_on_every_backend(
    make_client: ClientFactory, engine_of: EngineOf, request: pytest.FixtureRequest, model: str, metric: str
) -> None:
    engine = engine_of(model)
    assert engine.describe()["read_rows_last_layer"] == "yes"  # each copy's last layer at its one row
    client = await make_client(engine=engine)
    response = await client.post("/score", json={"inputs": TEXTS, "parameters": {"metric": metric, "tokens": True}})
    assert response.status == 200, await response.text()
    answers: list[dict[str, Any]] = await response.json()
    for text, answer in zip(TEXTS, answers, strict=True):
        expected = oracle(model_dir(model, request), text, metric)
        assert [t["score"] for t in answer["tokens"]] == pytest.approx(expected, abs=TOLERANCE)
        assert answer["score"] == pytest.approx(sum(expected), abs=TOLERANCE)


def test_the_test_texts_hold_words_of_several_tokens_on_every_model(request: pytest.FixtureRequest) -> None:
    # Otherwise within_word_l2r would equal original and its test would prove nothing.
    for name in MODELS:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir(name, request)))
        word_ids = [w for text in TEXTS for w in tokenizer(text).word_ids() if w is not None]
        assert len(word_ids) > len(set(word_ids)), name


def test_original_masks_one_token_per_copy_and_skips_special_tokens() -> None:
    words = ((101, 7, 8, 9, 102), (None, 0, 1, 1, None))
    copies = masked_copies(words, 4, "original", LAYOUT).copies
    assert [c.input_ids for c in copies] == [(101, 4, 8, 9, 102), (101, 7, 4, 9, 102), (101, 7, 8, 4, 102)]
    assert [(c.target_ids, c.answer_positions) for c in copies] == [((7,), (1,)), ((8,), (2,)), ((9,), (3,))]
    # The server reads each answer itself: no sequence is decoded, no JSON built.
    assert all(c.read_by_server for c in copies)


def test_within_word_l2r_masks_the_rest_of_the_word_to_the_right_only() -> None:
    words = ((101, 7, 8, 9, 10, 102), (None, 0, 1, 1, 1, None))
    assert [masked_positions(words, p, "within_word_l2r") for p in scored_positions(words)] == [
        [1],
        [2, 3, 4],
        [3, 4],
        [4],
    ]


def test_a_copy_costs_one_text_of_one_prediction_whatever_its_masks() -> None:
    words = ((101, 7, 8, 9, 102), (None, 0, 0, 0, None))
    first = masked_copies(words, 4, "within_word_l2r", LAYOUT).copies[0]
    assert (first.n_masks, first.predictions, first.n_tokens) == (1, 1, 5)
    assert first.prediction_tokens == 0  # no sequence is decoded


def test_the_score_is_the_sum_of_the_true_tokens_log_probabilities() -> None:
    words = ((101, 7, 8, 102), (None, 0, 1, None))
    copies = masked_copies(words, 4, "original", LAYOUT).copies
    answers = [
        [[{"score": 0.5, "token": 7, "token_str": "a", "sequence": ""}]],
        [[{"score": 0.25, "token": 8, "token_str": "b", "sequence": ""}]],
    ]
    score = text_score(copies, answers)  # type: ignore[arg-type]
    assert score.score == pytest.approx(-3 * 0.6931471805599453)
    assert [(t["token"], t["token_str"]) for t in score.tokens] == [(7, "a"), (8, "b")]


def test_tokens_whose_probability_underflowed_give_the_lowest_float_not_an_error() -> None:
    words = ((101, 7, 8, 9, 102), (None, 0, 1, 2, None))
    copies = masked_copies(words, 4, "original", LAYOUT).copies
    answers = [[[{"score": p, "token": t, "token_str": "", "sequence": ""}]] for p, t in ((0.0, 7), (0.0, 8), (0.5, 9))]
    score = text_score(copies, answers)  # type: ignore[arg-type]
    # Two underflowed tokens sum below any float: the score is the lowest one, still valid JSON.
    assert score.score == LOWEST_SCORE == -sys.float_info.max
    assert [t["score"] for t in score.tokens] == [LOWEST_SCORE, LOWEST_SCORE, pytest.approx(math.log(0.5))]


def test_text_scores_split_one_list_of_answers_back_into_texts_in_order() -> None:
    first = masked_copies(((101, 7, 102), (None, 0, None)), 4, "original", LAYOUT).copies
    second = masked_copies(((101, 8, 9, 102), (None, 0, 1, None)), 4, "original", LAYOUT).copies
    answers = [
        [[{"score": p, "token": t, "token_str": "", "sequence": ""}]] for p, t in ((0.5, 7), (0.25, 8), (1.0, 9))
    ]
    scores = text_scores([first, second], answers)  # type: ignore[arg-type]
    assert [s.score for s in scores] == pytest.approx([math.log(0.5), math.log(0.25)])
    assert [[t["token"] for t in s.tokens] for s in scores] == [[7], [8, 9]]
