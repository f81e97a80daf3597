"""A fill-mask request with ``whole_words``: each mask's search (word_search.py), run in rounds.

The plan's rows are the first round's; :meth:`WordSearchPlan.next_round` takes a round's answers
and gives the next round's rows, until every search is done (request/run_task.py loops them
through the same queue and batcher as any row, so a round's copies share passes with other
requests). Admission prices the request once, by the rows all its rounds can need
(:attr:`WordSearchPlan.bound`). The fold decodes each mask's words into the pipeline's shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from maskserve.errors import InvalidInput, TextTooLong
from maskserve.model_api import FillMaskModel, Prediction, Query, TextPredictions, text_answer_json
from maskserve.serving.costs import Work
from maskserve.serving.work_queue import Answer, slowest
from maskserve.tasks.windows import Layout, LongText, Window, fits, word_windows
from maskserve.tasks.word_search import MaskSearch, rows_bound


@dataclass(frozen=True)
class SearchSize:
    """How large a request's searches may grow: pieces a word, prefixes a length, rows queued."""

    max_pieces: int
    beam: int
    max_queue: int


@dataclass(frozen=True)
class TextSearch:
    """One text's searches, one per mask in text order."""

    query: Query
    positions: tuple[int, ...]
    searches: tuple[MaskSearch, ...]
    # How many windows the text is read in: 1 when the model reads it whole.
    windows: int = 1


class WordSearchPlan:
    """Every text's searches. Its state moves on round by round (:meth:`next_round`): it belongs
    to the one request that made it, and only that request's run touches it."""

    def __init__(self, texts: Sequence[TextSearch], max_pieces: int, beam: int) -> None:
        self.texts = tuple(texts)
        self.max_pieces, self.beam = max_pieces, beam
        self._asked: list[tuple[MaskSearch, int]] = []
        self.queries: tuple[Query, ...] = self._round()

    @property
    def windows(self) -> tuple[int, ...]:
        return tuple(text.windows for text in self.texts)

    @property
    def bound(self) -> Work:
        """What all the rounds can cost together: each mask's most rows, each the text grown by
        the longest word's pieces, or its window so grown (the admission's price, fixed before any
        work)."""
        rows = rows_bound(self.max_pieces, self.beam)
        texts = tokens = 0
        for text in self.texts:
            texts += len(text.searches) * rows
            tokens += sum(rows * search.longest_row for search in text.searches)
        return Work(texts=texts, tokens=tokens, predictions=texts * max(self.beam, self.texts[0].query.top_k))

    def _round(self) -> tuple[Query, ...]:
        queries: list[Query] = []
        self._asked = []
        for text in self.texts:
            for search in text.searches:
                if not search.done:
                    asked = search.queries()
                    self._asked.append((search, len(asked)))
                    queries.extend(asked)
        return tuple(queries)

    def next_round(self, answers: Sequence[Answer]) -> tuple[Query, ...]:
        """Take the last round's answers (one per row it asked, in order); the next round's rows,
        or none once every search is done."""
        start = 0
        for search, count in self._asked:
            search.advance([answer.predictions for answer in answers[start : start + count]])
            start += count
        if start != len(answers):
            raise RuntimeError(f"{len(answers)} answers for {start} search rows; this is a bug")
        return self._round()

    @property
    def decoded_predictions(self) -> int:
        """Words decoded into the answer, times their texts' tokens."""
        return sum(len(t.positions) * t.query.top_k * t.query.n_tokens for t in self.texts)


def search_answers(plan: WordSearchPlan, answers: Sequence[Answer], model: FillMaskModel) -> list[Answer]:
    """Per text, its masks' words in the pipeline's shape (as whole-word targets': ``tokens`` lists
    the pieces), served as the request's slowest row was."""
    if not answers:
        raise RuntimeError("a whole-word search answered without rows; this is a bug")
    timing = slowest(answers)
    result: list[Answer] = []
    for text in plan.texts:
        predictions: TextPredictions = []
        for position, search in zip(text.positions, text.searches):
            mask: list[Prediction] = []
            for word in search.words:
                token_str, sequence = model.fill_word(text.query.input_ids, position, word.pieces)
                mask.append(
                    Prediction(
                        score=word.score,
                        token=word.pieces[0],
                        token_str=token_str,
                        sequence=sequence,
                        tokens=list(word.pieces),
                    )
                )
            predictions.append(mask)
        result.append(
            dataclasses.replace(
                answers[0],
                predictions=predictions,
                json=text_answer_json(predictions),
                queued_s=timing.queued_s,
                inference_s=timing.inference_s,
                batch_size=timing.batch_size,
            )
        )
    return result


def _reads(
    query: Query, position: int, by_length: dict[int, dict[int, tuple[Window, Layout]]]
) -> dict[int, tuple[Sequence[int], int]]:
    """Per word length read in windows, the window a mask's rows read: its ids, the mask's place."""
    reads: dict[int, tuple[Sequence[int], int]] = {}
    for length, around in by_length.items():
        if position in around:
            window, narrow = around[position]
            reads[length] = (window.ids(query.input_ids, narrow), window.local(position, narrow))
    return reads


def plan_search(
    queries: Sequence[Query],
    fields: Sequence[str],
    model: FillMaskModel,
    search: SearchSize,
    long_text: LongText,
    words_of: Callable[[int], Sequence[int | None]],
) -> WordSearchPlan:
    """Each text's (its query's) searches, one per mask, checked: a copy (the text grown by a
    word's pieces) the model cannot read whole is read in windows (unless ``long_text`` refuses),
    and all the rounds' rows must fit the queue. ``words_of(i)`` gives text i's words, asked only
    for a text read in windows (a second pass of the tokenizer)."""
    layout = Layout.of(model)
    pieces = search.max_pieces
    longest = layout.inner // 2 + 1
    if pieces > longest:
        raise InvalidInput(
            f"parameters.max_word_pieces is {pieces}; this model reads {layout.length} tokens, so a word may take "
            f"at most {longest} (half of them, so that its copies keep some text)",
            field="parameters.max_word_pieces",
        )
    classes = model.word_pieces()
    texts: list[TextSearch] = []
    for index, (query, field) in enumerate(zip(queries, fields, strict=True)):
        positions = tuple(i for i, token in enumerate(query.input_ids) if token == model.mask_token_id)
        grown_fits = fits(query.n_tokens + pieces - 1, layout)
        if not grown_fits and long_text == "refuse":
            raise TextTooLong(
                f"{field} has {query.n_tokens} tokens; with a word of {pieces} pieces in place of a mask it "
                f"would have more than the {layout.length} this model reads, and parameters.long_text "
                '"refuse" asks not to read it in windows',
                field=field,
            )
        # Per word length, as whole-word targets are read, so a word scores as it does as a target.
        by_length = word_windows(
            query.n_tokens, positions, range(1, pieces + 1), layout, None if grown_fits else words_of(index)
        )
        cut = {(w.start, w.end) for around in by_length.values() for w, _ in around.values()}
        searches = tuple(
            MaskSearch(
                query.input_ids,
                position,
                model.mask_token_id,
                top_k=query.top_k,
                max_pieces=pieces,
                beam=search.beam,
                pieces=classes,
                is_words=model.whole_words,
                reads=_reads(query, position, by_length),
            )
            for position in positions
        )
        texts.append(TextSearch(query, positions, searches, windows=max(1, len(cut))))
    plan = WordSearchPlan(texts, pieces, search.beam)
    rows, per_mask = plan.bound.texts, rows_bound(pieces, search.beam)
    if rows > search.max_queue:
        raise InvalidInput(
            f"this request's whole-word search can queue {rows} copies of its texts ({per_mask} a "
            f"mask over its rounds); the queue holds {search.max_queue} (--max-queue): send fewer masks, or a smaller "
            "parameters.word_beam or max_word_pieces",
            field="parameters.word_beam",
        )
    return plan
