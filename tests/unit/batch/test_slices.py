"""batch/slices.py: a slice's rows planned once each, its queries deduplicated and packed within the
batcher's limits, and a query the engine cannot answer failing its own rows alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from maskserve.batch.job_tasks import FillMaskJob, ScoreJob
from maskserve.batch.slices import (
    OFFLINE_BATCH_SIZE,
    OFFLINE_BATCH_TOKENS,
    Packing,
    fold_slice,
    job_packing,
    pack,
    plan_slice,
    row_id,
    row_input,
    run_batches,
)
from maskserve.config.bounds import settings_from
from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.errors import InvalidInput
from maskserve.model_api import Query, TextPredictions

PACKING = Packing(max_batch_size=4, max_batch_tokens=64)


def test_a_text_sent_twice_is_one_query_and_both_rows_get_its_answer(bert_engine: FillMaskEngine) -> None:
    rows = [{"text": "the [MASK] sat."}, {"text": "a [MASK] ran."}, {"text": "the [MASK] sat."}]
    planned = plan_slice(0, 10, rows, FillMaskJob(Settings()), bert_engine, {}, PACKING)
    assert len(planned.queries) == 2
    assert [row.queries for row in planned.rows] == [[0], [1], [0]]
    assert [row.id for row in planned.rows] == [10, 11, 12]  # row numbers in the file
    answered = fold_slice(planned, run_batches(bert_engine, planned), FillMaskJob(Settings()), bert_engine)
    assert answered[0]["result"] == answered[2]["result"] != answered[1]["result"]


def test_batches_are_sorted_by_length_within_the_batchers_limits(bert_engine: FillMaskEngine) -> None:
    rows = [{"text": " ".join(["word"] * n) + " [MASK]."} for n in (12, 1, 7, 3, 20, 2, 9, 5, 1)]
    planned = plan_slice(0, 0, rows, ScoreJob(Settings()), bert_engine, {}, PACKING)
    lengths = [[planned.queries[i].n_tokens for i in batch] for batch in planned.batches]
    assert sorted(i for batch in planned.batches for i in batch) == list(range(len(planned.queries)))
    for batch in lengths:
        assert len(batch) <= 4 and (len(batch) == 1 or len(batch) * max(batch) <= 64)
    flat = [n for batch in lengths for n in batch]
    assert flat == sorted(flat)


class FailsOn:
    """The engine, except that any pass holding a query ``poisoned`` says is poisoned raises."""

    def __init__(self, engine: FillMaskEngine, poisoned: Callable[[Query], bool]) -> None:
        self.engine, self.poisoned, self.passes = engine, poisoned, 0
        self.seen: list[Sequence[Query]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def predict(self, queries: Sequence[Query], progress: Any = None) -> list[TextPredictions]:
        self.passes += 1
        self.seen.append(queries)
        if any(self.poisoned(query) for query in queries):
            raise RuntimeError("/secret/path: poisoned")
        return self.engine.predict(queries)


def test_a_query_the_engine_fails_on_fails_its_rows_alone(bert_engine: FillMaskEngine) -> None:
    task = FillMaskJob(Settings())
    rows = [{"text": f"the {w} [MASK] sat."} for w in ("cat", "dog", "man")] + [{"text": "the dog [MASK] sat."}]
    planned = plan_slice(0, 0, rows, task, bert_engine, {}, Packing(32, 8192))
    failing = FailsOn(bert_engine, lambda query: query == planned.queries[1])
    outcomes = run_batches(failing, planned)  # type: ignore[arg-type]
    assert failing.passes == 1 + 3  # the batch, then each query alone
    answered = fold_slice(planned, outcomes, task, bert_engine)
    assert answered[1]["error"] == answered[3]["error"] == {"type": "inference_failed", "message": "inference failed"}
    assert "result" in answered[0] and "result" in answered[2]


def test_whole_word_rows_move_through_their_rounds_together_and_a_failed_round_fails_its_row_alone(
    bert_engine: FillMaskEngine,
) -> None:
    task = FillMaskJob(Settings())
    words = {"whole_words": True, "top_k": 2}
    rows = [
        {"text": "the cat [MASK] sat.", "parameters": words},
        {"text": "the dog [MASK] sat.", "parameters": words},
        {"text": "the man [MASK] sat."},
    ]
    planned = plan_slice(0, 0, rows, task, bert_engine, {}, Packing(512, 32768))
    counting = FailsOn(bert_engine, lambda query: False)
    answered = fold_slice(planned, run_batches(counting, planned), task, bert_engine)  # type: ignore[arg-type]
    # The first pass, then one pass per later round (at most max_word_pieces in all), each
    # holding both searches' rows together.
    cat, dog = bert_engine.tokenizer.convert_tokens_to_ids(["cat", "dog"])
    assert 2 <= counting.passes <= 3
    for later_round in counting.seen[1:]:
        assert any(cat in q.input_ids for q in later_round) and any(dog in q.input_ids for q in later_round)
    for together, row in zip(answered[:2], rows[:2]):
        single = plan_slice(0, 0, [row], task, bert_engine, {}, Packing(512, 32768))
        (alone,) = fold_slice(single, run_batches(bert_engine, single), task, bert_engine)
        assert [p["tokens"] for p in together["result"]] == [p["tokens"] for p in alone["result"]]
        assert [p["score"] for p in together["result"]] == pytest.approx(
            [p["score"] for p in alone["result"]], rel=1e-5
        )
    # The first row's later rounds fail (its text's "cat" in every copy): that row alone errs.
    planned = plan_slice(0, 0, rows, task, bert_engine, {}, Packing(512, 32768))
    later = FailsOn(bert_engine, lambda query: later.passes > 1 and cat in query.input_ids)
    answered = fold_slice(planned, run_batches(later, planned), task, bert_engine)  # type: ignore[arg-type]
    assert answered[0]["error"] == {"type": "inference_failed", "message": "inference failed"}
    assert "result" in answered[1] and "result" in answered[2]


def test_a_rows_parameters_override_the_jobs_key_by_key_and_may_be_json_text() -> None:
    assert row_input({"text": "t", "parameters": '{"top_k": 2}'}, {"top_k": 5, "targets": ["a"]}) == (
        "t",
        {"top_k": 2, "targets": ["a"]},
    )
    assert row_input({"text": "t", "parameters": ""}, {"top_k": 5}) == ("t", {"top_k": 5})
    for row, says in (
        ({"text": 3}, "the row has no text"),
        ({"text": "t", "parameters": "{"}, "the row's parameters are not JSON"),
        ({"text": "t", "parameters": [1]}, "must be a JSON object"),
        ({"__unreadable__": "the line is not JSON"}, "the line is not JSON"),
    ):
        with pytest.raises(InvalidInput, match=says):
            row_input(row, {})


def test_a_rows_id_is_its_own_or_its_row_number() -> None:
    assert [row_id({"id": value}, 7) for value in ("a", 3, None, "", 2.5, True)] == ["a", 3, 7, 7, "2.5", "True"]


def test_packing_nothing_is_no_batch_and_a_text_past_the_budget_runs_alone() -> None:
    assert pack([], PACKING) == []
    queries = [Query(input_ids=(1,) * n, top_k=1) for n in (10, 100, 10)]
    assert pack(queries, PACKING) == [[0, 2], [1]]


def test_a_job_packs_by_the_batchers_limits_where_set_else_by_the_offline_defaults() -> None:
    assert job_packing(settings_from({})) == Packing(OFFLINE_BATCH_SIZE, OFFLINE_BATCH_TOKENS)
    assert job_packing(settings_from({"max_batch_size": 8})) == Packing(8, OFFLINE_BATCH_TOKENS)
