"""A slice of input rows planned for the engine, and the engine's answers folded back into rows.

Planning a slice tokenizes each row once (the task's own parser and plan, with the server's limits),
gives a row the API would refuse its error, deduplicates the slice's queries (a text sent twice, or
two scoring copies alike, run once) and packs them by length into batches within the batcher's
limits (offline defaults where they are not set). Rows answered in rounds (a whole-word search)
move through their later rounds together once the slice's first passes are done. Folding turns
each row's answers into the API's answer, or an error row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from maskserve.batch.formats import Row
from maskserve.batch.job_tasks import JobTask, answer_of
from maskserve.config.settings import Settings
from maskserve.errors import InferenceFailed, InvalidInput, MaskserveError
from maskserve.model_api import FillMaskModel, Query, TextPredictions
from maskserve.tasks.task import Plan, Rounds

log = logging.getLogger(__name__)

# A job's passes unless --max-batch-size and --max-batch-tokens say otherwise: past these sizes a
# pass's fixed cost is a small share of it (benchmarks/batch.py measures rows/s by batch size),
# and the token budget bounds a pass's memory as the server's does, a few times over.
OFFLINE_BATCH_SIZE = 512
OFFLINE_BATCH_TOKENS = 32768


@dataclass(frozen=True)
class Packing:
    """The batcher's limits on one forward pass."""

    max_batch_size: int
    max_batch_tokens: int


@dataclass
class PlannedRow:
    """One input row: its id and either its plan (with its queries' places in the slice) or its error."""

    id: Any
    request: Any = None
    plan: Plan | None = None
    queries: list[int] = field(default_factory=list)
    error: dict[str, Any] | None = None


@dataclass
class PlannedSlice:
    """A slice's rows, its distinct queries, and the batches they run in (indices into ``queries``)."""

    number: int
    rows: list[PlannedRow]
    queries: list[Query]
    batches: list[list[int]]
    # The limits its batches were packed in, for the rows answered in rounds (a whole-word search).
    packing: Packing


def error_row(error: MaskserveError) -> dict[str, Any]:
    """The API's error for a row: its kind and message, and its details (the field it names)."""
    return {"type": error.kind, "message": error.message, **error.details()}


def row_input(row: Row, defaults: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A row's text and its parameters (the job's, then the row's own, key by key); raises
    :class:`InvalidInput` naming what the row lacks."""
    unreadable = row.get("__unreadable__")
    if unreadable is not None:
        raise InvalidInput(str(unreadable))
    text = row.get("text")
    if not isinstance(text, str):
        raise InvalidInput("the row has no text: its 'text' must be a string", field="text")
    own = row.get("parameters")
    if isinstance(own, str):  # CSV, or Parquet written as text: the parameters as JSON
        try:
            own = json.loads(own) if own.strip() else None
        except ValueError:
            raise InvalidInput("the row's parameters are not JSON", field="parameters") from None
    if own is not None and not isinstance(own, dict):
        raise InvalidInput("the row's parameters must be a JSON object", field="parameters")
    return text, {**defaults, **(own or {})}


def row_id(row: Row, number: int) -> Any:
    """The row's ``id`` (text or a whole number, as given), or its row number in the file from 0."""
    given = row.get("id")
    if given is None or given == "":
        return number
    return given if isinstance(given, (int, str)) and not isinstance(given, bool) else str(given)


def plan_slice(
    number: int,
    first_row: int,
    rows: Sequence[Row],
    task: JobTask,
    model: FillMaskModel,
    defaults: dict[str, Any],
    packing: Packing,
) -> PlannedSlice:
    """Plan slice ``number``, whose first row is row ``first_row`` of the file."""
    planned: list[PlannedRow] = []
    places: dict[Query, int] = {}
    queries: list[Query] = []
    for offset, row in enumerate(rows):
        entry = PlannedRow(id=row_id(row, first_row + offset))
        try:
            text, parameters = row_input(row, defaults)
            entry.request, entry.plan = task.plan(text, parameters, model)
        except MaskserveError as exc:
            entry.error = error_row(exc)
        else:
            for query in entry.plan.queries:
                place = places.setdefault(query, len(queries))
                if place == len(queries):
                    queries.append(query)
                entry.queries.append(place)
        planned.append(entry)
    return PlannedSlice(number, planned, queries, pack(queries, packing), packing)


def pack(queries: Sequence[Query], packing: Packing) -> list[list[int]]:
    """``queries`` sorted by length and cut into full batches within the batcher's limits, as
    indices into ``queries``; a query longer than the token budget runs alone.

    Greedy, not the batcher's least-cost split: in a slice sorted by length neighbours differ by a
    token or two, so padding is small whatever the cuts, and a pass's fixed cost makes the fullest
    batches the cheapest; the split's cost grows with slice x batch size, a planning cost the
    inference thread's neighbour would pay on every slice.
    """
    order = sorted(range(len(queries)), key=lambda i: queries[i].n_tokens)
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        grown = len(current) + 1
        if current and (grown > packing.max_batch_size or grown * queries[index].n_tokens > packing.max_batch_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def job_packing(settings: Settings) -> Packing:
    """The limits of a job's forward passes: the batcher's where the user set them, else the
    offline defaults (a job has no request waiting on a pass, so only throughput counts, and a
    pass's fixed cost shrinks per row with its size)."""
    given = settings.given
    return Packing(
        max_batch_size=settings.max_batch_size if "max_batch_size" in given else OFFLINE_BATCH_SIZE,
        max_batch_tokens=settings.max_batch_tokens if "max_batch_tokens" in given else OFFLINE_BATCH_TOKENS,
    )


# What the inference stage gives back for each of a slice's queries: its predictions, or the
# failure that a pass of it alone raised.
Outcome = TextPredictions | Exception


def run_batches(model: FillMaskModel, planned: PlannedSlice) -> list[Outcome]:
    """Every query of the slice answered, batch by batch, then the rounds of its rows that are
    answered in rounds (:func:`run_rounds`)."""
    outcomes = answer_batches(model, planned.queries, planned.batches)
    run_rounds(model, planned, outcomes)
    return outcomes


def answer_batches(model: FillMaskModel, queries: Sequence[Query], batches: Sequence[list[int]]) -> list[Outcome]:
    """Every query answered, batch by batch. A batch that fails is run again a query at a time, so
    one query the engine cannot answer fails alone and its neighbours are answered."""
    outcomes: list[Outcome | None] = [None] * len(queries)
    for batch in batches:
        try:
            answered: list[Outcome] = list(model.predict([queries[i] for i in batch]))
        except Exception:  # noqa: BLE001  # any failure of the pass: each query retried alone
            answered = [_alone(model, queries[i]) for i in batch]
        for index, outcome in zip(batch, answered, strict=True):
            outcomes[index] = outcome
    if any(outcome is None for outcome in outcomes):
        raise RuntimeError("a query of the slice was in no batch; this is a bug")
    return [outcome for outcome in outcomes if outcome is not None]


def run_rounds(model: FillMaskModel, planned: PlannedSlice, outcomes: Sequence[Outcome]) -> None:
    """Move every row answered in rounds (its plan a :class:`Rounds`) through its later rounds,
    all the slice's such rows in step: each round's rows packed together and answered, until every
    plan is done. A row whose round fails gets the error a failed query gives."""
    waiting: list[tuple[PlannedRow, Rounds, list[Query], list[Outcome]]] = []
    for entry in planned.rows:
        plan: object = entry.plan  # a task's plan, which may also be answered in rounds
        if isinstance(plan, Rounds) and entry.error is None:
            own = [planned.queries[i] for i in entry.queries]
            waiting.append((entry, plan, own, [outcomes[i] for i in entry.queries]))
    while waiting:
        queries: list[Query] = []
        asked: list[tuple[PlannedRow, Rounds, int]] = []
        for entry, rounds, last, answered in waiting:
            answers = [answer_of(q, o, len(last)) for q, o in zip(last, answered) if not isinstance(o, Exception)]
            if len(answers) < len(last):
                entry.error = error_row(InferenceFailed("inference failed"))
                continue
            following = rounds.next_round(answers)
            if following:
                asked.append((entry, rounds, len(following)))
                queries.extend(following)
        outcomes = answer_batches(model, queries, pack(queries, planned.packing))
        waiting, start = [], 0
        for entry, rounds, count in asked:
            waiting.append((entry, rounds, queries[start : start + count], list(outcomes[start : start + count])))
            start += count


def _alone(model: FillMaskModel, query: Query) -> Outcome:
    try:
        return model.predict([query])[0]
    except Exception as exc:  # this query's own failure, kept for its rows
        log.exception("a query of %d tokens failed on its own", query.n_tokens)
        return exc


def fold_slice(planned: PlannedSlice, outcomes: Sequence[Outcome], task: JobTask, model: FillMaskModel) -> list[Row]:
    """The slice's output rows, in input order: each row's answer or its error."""
    rows: list[Row] = []
    for entry in planned.rows:
        if entry.error is not None:
            rows.append({"id": entry.id, "error": entry.error})
            continue
        mine = [outcomes[i] for i in entry.queries]
        if any(isinstance(outcome, Exception) for outcome in mine):
            rows.append({"id": entry.id, "error": error_row(InferenceFailed("inference failed"))})
            continue
        answers = [
            answer_of(planned.queries[i], outcome, len(mine))
            for i, outcome in zip(entry.queries, mine, strict=True)
            if not isinstance(outcome, Exception)
        ]
        try:
            result = task.result(entry.request, entry.plan, answers, model)  # type: ignore[arg-type]  # planned
        except MaskserveError as exc:  # a check that runs on the answer (its size)
            rows.append({"id": entry.id, "error": error_row(exc)})
        else:
            rows.append({"id": entry.id, "result": result})
    return rows
