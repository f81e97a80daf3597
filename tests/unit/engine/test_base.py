"""The engine without HTTP (engine/base.py): encoding, targets, answers one per query, the head at the
answer positions only.

Tests that take ``engine_of`` or ``load_on_backend`` run on each backend (torch, onnxruntime).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from maskserve.engine import FillMaskEngine
from maskserve.engine.base import IndexTensors
from maskserve.model_api import Query
from tests.conftest import EngineOf

Load = Callable[[str | None], FillMaskEngine]


def test_default_engine_is_the_shipped_bert(engine_of: EngineOf) -> None:
    default_engine = engine_of("default")
    assert default_engine.mask_token == "[MASK]"
    assert default_engine.max_tokens == 512


def test_bert_and_roberta_know_their_mask_and_token_limit(engine_of: EngineOf) -> None:
    bert_engine, roberta_engine = engine_of("bert"), engine_of("roberta")
    assert bert_engine.mask_token == "[MASK]" and bert_engine.max_tokens == 128
    # RoBERTa's positions start after the padding index: 130 positions hold 128 tokens.
    assert roberta_engine.mask_token == "<mask>" and roberta_engine.max_tokens == 128


def test_longest_accepted_text_runs(engine_of: EngineOf) -> None:
    roberta_engine = engine_of("roberta")
    # A text of exactly max_tokens must fit the position embeddings (an off-by-two would raise).
    ids = roberta_engine.encode(" dog" * 125 + "<mask>")
    assert len(ids) == roberta_engine.max_tokens
    answer = roberta_engine.predict([Query(input_ids=ids, top_k=2)])
    assert len(answer) == 1 and len(answer[0][0]) == 2


def test_encode_adds_special_tokens_and_counts_masks(engine_of: EngineOf) -> None:
    bert_engine = engine_of("bert")
    ids = bert_engine.encode("the [MASK] and the [MASK]")
    tokenizer = bert_engine.tokenizer
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert bert_engine.count_masks(ids) == 2
    assert bert_engine.count_masks(bert_engine.encode("the dog")) == 0


def test_targets_are_resolved_in_order_without_duplicates(engine_of: EngineOf) -> None:
    bert_engine = engine_of("bert")
    to_id = bert_engine.tokenizer.convert_tokens_to_ids
    assert bert_engine.resolve_targets(["dog", "city", "dog"]) == (to_id("dog"), to_id("city"))


def test_predict_returns_one_answer_per_query_in_order(engine_of: EngineOf) -> None:
    bert_engine = engine_of("bert")
    assert bert_engine.predict([]) == []
    queries = [
        Query(input_ids=bert_engine.encode("[MASK]"), top_k=1),
        Query(input_ids=bert_engine.encode("a [MASK] b [MASK] c [MASK]"), top_k=4),
        Query(input_ids=bert_engine.encode("the [MASK] dog"), top_k=3, target_ids=bert_engine.resolve_targets(["cat"])),
    ]
    answers = bert_engine.predict(queries)
    assert [len(a) for a in answers] == [1, 3, 1]  # masks per text
    assert [len(a[0]) for a in answers] == [1, 4, 1]  # top_k, capped by the number of targets
    assert answers[2][0][0]["token_str"] == "cat"
    for answer in answers:
        for mask in answer:
            scores = [p["score"] for p in mask]
            assert scores == sorted(scores, reverse=True)
            assert all(0.0 <= s <= 1.0 for s in scores)


def test_an_answer_read_by_the_server_has_the_same_scores_and_no_sequence(engine_of: EngineOf) -> None:
    bert_engine = engine_of("bert")
    ids = bert_engine.encode("the [MASK] dog runs")
    sent, read = bert_engine.predict([Query(ids, top_k=3), Query(ids, top_k=3, read_by_server=True)])
    assert [(p["token"], p["token_str"]) for p in read[0]] == [(p["token"], p["token_str"]) for p in sent[0]]
    assert [p["score"] for p in read[0]] == pytest.approx([p["score"] for p in sent[0]], abs=1e-6)
    assert all(p["sequence"] for p in sent[0]) and not any(p["sequence"] for p in read[0])


def test_the_head_runs_only_at_a_querys_answer_position(engine_of: EngineOf, monkeypatch: pytest.MonkeyPatch) -> None:
    bert_engine = engine_of("bert")
    ids = bert_engine.encode("a [MASK] [MASK] [MASK] b")
    asked: list[list[tuple[int, int]]] = []
    compute = bert_engine._mask_logits

    def recording(input_ids: Any, attention_mask: Any, rows: Any, cols: Any) -> torch.Tensor:
        asked.append(list(zip(rows.tolist(), cols.tolist())))
        return compute(input_ids, attention_mask, rows, cols)

    monkeypatch.setattr(bert_engine, "_mask_logits", recording)
    every, one = bert_engine.predict([Query(ids, top_k=2), Query(ids, top_k=2, answer_positions=(3,))])
    # The second text's masks at 2 and 4 are context: no logits are computed there.
    assert asked == [[(0, 2), (0, 3), (0, 4), (1, 3)]]
    assert len(every) == 3 and len(one) == 1
    assert [p["token"] for p in one[0]] == [p["token"] for p in every[1]]
    assert [p["score"] for p in one[0]] == pytest.approx([p["score"] for p in every[1]], abs=1e-6)
    # Its sequence is written as for a text of several masks (special tokens kept), as before.
    assert one[0][0]["sequence"] == every[1][0]["sequence"]


def test_a_target_lists_index_is_built_once_per_list_object_and_equal_lists_get_their_own() -> None:
    indexes = IndexTensors(size=2)
    starts = tuple(range(5, 30000))
    first = indexes(starts)
    assert indexes(starts) is first and first.tolist() == list(starts)
    # An equal list that is another object is indexed on its own, with the same values.
    other = tuple(range(5, 30000))
    assert indexes(other) is not first and indexes(other).tolist() == list(starts)
    # Past its size the oldest entry goes; a list asked again is built again, right.
    indexes((1, 2))
    rebuilt = indexes(starts)
    assert rebuilt is not first and rebuilt.tolist() == list(starts)
