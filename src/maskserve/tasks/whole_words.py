"""Whole-word targets: a fill-mask target of several tokens scored as the word, by the chain rule.

A target of k > 1 tokens t_1..t_k fills a mask with all k: its score is the product over i of
P(t_i | the text with t_1..t_{i-1} in place and t_i..t_k masked). Given the word, the k factors
are independent (teacher forcing), so each is one copy of the text: an ordinary
:class:`~maskserve.model_api.Query` whose one target is t_i, read at t_i's row. The copies are
queued, priced and batched with the text's own query (its single-token targets, answered exactly
as the pipeline answers them), then combined here. Pure arithmetic: no model, no HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from maskserve.model_api import Prediction, Query, TextPredictions, copy_prediction
from maskserve.tasks.windows import Layout, Window, fits, windows, word_windows

# "first_token" is the pipeline's own behaviour: a target stands for its first token.
MultiTokenTargets = Literal["whole_word", "first_token"]
MULTI_TOKEN_TARGETS: tuple[MultiTokenTargets, ...] = ("whole_word", "first_token")
DEFAULT_MULTI_TOKEN_TARGETS: MultiTokenTargets = "whole_word"

# (input_ids, mask position, word) -> (token_str, sequence): the model's decoding (fill_word).
FillWord = Callable[[Sequence[int], int, Sequence[int]], tuple[str, str]]


@dataclass(frozen=True)
class Targets:
    """A request's targets, resolved: the single tokens the pipeline would score, and whole words."""

    single: tuple[int, ...]
    words: tuple[tuple[int, ...], ...]
    # Each word's target as the request wrote it, for errors that name one.
    names: tuple[str, ...] = ()


def split_targets(
    targets: Sequence[str], tokens: Sequence[tuple[int, ...]], mode: MultiTokenTargets = DEFAULT_MULTI_TOKEN_TARGETS
) -> Targets:
    """Each target (with its tokens, in the same order) as a single token or a whole word.

    A target of one token, or any target in ``first_token`` mode, is its first token, as in the
    pipeline; a target of several is a whole word. A target of no tokens is dropped; duplicates
    (same token, same word) are kept once.
    """
    single: list[int] = []
    words: list[tuple[int, ...]] = []
    names: list[str] = []
    for name, ids in zip(targets, tokens, strict=True):
        if not ids:
            continue
        if len(ids) == 1 or mode == "first_token":
            if ids[0] not in single:
                single.append(ids[0])
        elif ids not in words:
            words.append(ids)
            names.append(name)
    return Targets(tuple(single), tuple(words), tuple(names))


def word_copies(input_ids: Sequence[int], mask_token_id: int, position: int, word: Sequence[int]) -> list[Query]:
    """The k copies of a text that score ``word`` on the mask at ``position``, one per token.

    Copy i holds t_1..t_{i-1}, then k-i+1 masks where the mask was, and reads t_i's row; the
    text's other masks stay masked.
    """
    k = len(word)
    before, after = tuple(input_ids[:position]), tuple(input_ids[position + 1 :])
    return [
        Query(
            input_ids=(*before, *word[:i], *([mask_token_id] * (k - i)), *after),
            top_k=1,
            target_ids=(token,),
            # One answer is read, whatever the number of masks: that is what the copy costs.
            n_masks=1,
            answer_positions=(position + i,),
            # Only its probability is read, here: no sequence to decode, no JSON to build.
            read_by_server=True,
        )
        for i, token in enumerate(word)
    ]


@dataclass(frozen=True)
class TextPlan:
    """One text's work: its own query (read whole, or in windows when too long), and each mask's
    whole words as copies of it (or of its window)."""

    # The text's own query: every mask, its single-token targets (or none: no targets at all).
    query: Query
    # The windows the own query is read in when the model cannot read the text whole; () when it can.
    reads: tuple[Query, ...] = ()
    words: tuple[tuple[int, ...], ...] = ()
    # Each mask's position in the text, in text order.
    positions: tuple[int, ...] = ()
    # Mask by mask, word by word, token by token.
    copies: tuple[Query, ...] = ()
    # How many distinct windows the text is read in, its own and its copies' (1: read whole).
    windows: int = 1

    @property
    def has_words(self) -> bool:
        return bool(self.words)

    @property
    def folds(self) -> bool:
        """Whether its rows' answers are combined into the text's: whole words, or windows."""
        return self.has_words or bool(self.reads)

    @property
    def asks_own(self) -> bool:
        """Whether the text's own query is queued: not when every target is a whole word."""
        return not self.has_words or bool(self.query.target_ids)

    @property
    def own_queries(self) -> tuple[Query, ...]:
        """The rows the text's own query is: itself, or its windows."""
        return self.reads or (self.query,)

    @property
    def queries(self) -> tuple[Query, ...]:
        """What this text queues, its own rows first."""
        return (self.own_queries if self.asks_own else ()) + self.copies

    @property
    def word_predictions(self) -> int:
        """Whole-word candidates this text's answer may hold: per mask, all its words (the cut to
        top_k comes after scoring)."""
        return len(self.positions) * len(self.words)

    @property
    def decoded_predictions(self) -> int:
        """Predictions whose ``sequence`` the fold decodes, each the whole text again: the words,
        and a windowed text's own predictions (a window decodes itself, not the text)."""
        own = self.query.predictions if self.reads and self.asks_own else 0
        return own + self.word_predictions

    @property
    def answer_predictions(self) -> int:
        """Predictions in this text's answer: per mask, top_k of its single tokens and words."""
        if not self.has_words:
            return self.query.predictions
        single = len(self.query.target_ids or ())
        return len(self.positions) * min(self.query.top_k, single + len(self.words))


def plan_text(
    query: Query,
    targets: Targets | None,
    mask_token_id: int,
    layout: Layout,
    word_ids: Sequence[int | None] | None = None,
) -> TextPlan:
    """A text's plan: its query alone, or with the copies that score each whole word on each mask;
    each read in windows where the model cannot read it whole (``word_ids``, the text's words,
    must be given then)."""
    words = () if targets is None else targets.words
    if not words and fits(query.n_tokens, layout):
        return TextPlan(query)
    positions = tuple(i for i, token in enumerate(query.input_ids) if token == mask_token_id)
    spans = [(position, position) for position in positions]

    def placed(narrow: Layout) -> list[Window]:
        if word_ids is None:
            raise ValueError("a text longer than the model reads is planned without its words; this is a bug")
        return windows(word_ids, spans, narrow)

    cut: set[tuple[int, int]] = set()
    reads: tuple[Query, ...] = ()
    # The text's own query is queued unless every target is a whole word: only then are its windows read.
    asks_own = not words or bool(query.target_ids)
    if asks_own and not fits(query.n_tokens, layout):
        own = placed(layout)
        cut.update((w.start, w.end) for w in own)
        reads = tuple(_window_query(query, window, layout) for window in own)
    # Each mask's window, per length of word; none where the copies fit the model whole.
    by_length = word_windows(query.n_tokens, positions, {len(word) for word in words}, layout, word_ids)
    cut.update((w.start, w.end) for around in by_length.values() for w, _ in around.values())
    copies: list[Query] = []
    for position in positions:
        for word in words:
            own_window = by_length[len(word)].get(position)
            if own_window is None:
                copies.extend(word_copies(query.input_ids, mask_token_id, position, word))
                continue
            window, narrow = own_window
            ids = window.ids(query.input_ids, narrow)
            copies.extend(word_copies(ids, mask_token_id, window.local(position, narrow), word))
    # The whole text is one more window when the text's own query reads it whole.
    read_whole = asks_own and not reads
    return TextPlan(query, reads, words, positions, tuple(copies), windows=max(1, len(cut) + read_whole))


def _window_query(query: Query, window: Window, layout: Layout) -> Query:
    """The text's own query, cut to ``window``: it answers the masks the window was cut for, and
    reads the others in it as context. Its predictions' ``sequence`` is the whole text's, decoded
    by the fold, so the window decodes none."""
    return Query(
        input_ids=window.ids(query.input_ids, layout),
        top_k=query.top_k,
        target_ids=query.target_ids,
        n_masks=len(window.asked),
        answer_positions=tuple(window.local(span[0], layout) for span in window.asked),
        read_by_server=True,
    )


def word_score(copies: Sequence[Query], answers: Sequence[TextPredictions]) -> float:
    """The chain rule's product: each copy's answer is its one token's probability."""
    score = 1.0
    for copy, answer in zip(copies, answers, strict=True):
        score *= copy_prediction(copy, answer, "whole-word")["score"]
    return score


def text_predictions(plan: TextPlan, answers: Sequence[TextPredictions], fill: FillWord) -> TextPredictions:
    """The text's answer from its queries' (:attr:`TextPlan.queries`, in order): per mask, its
    single-token candidates and its whole words by score, top_k kept.

    A windowed text's masks are answered window by window, in text order; their ``sequence`` is
    the whole text's. Only the words kept are decoded (``fill``). Ties keep single tokens first,
    then words in the order the request named them.
    """
    if len(answers) != len(plan.queries):
        raise RuntimeError(f"{len(answers)} answers for a text of {len(plan.queries)} queries; this is a bug")
    if not plan.folds:
        return answers[0]
    rows = len(plan.own_queries) if plan.asks_own else 0
    positions = plan.positions
    own = [mask for answer in answers[:rows] for mask in answer] if rows else [[] for _ in positions]
    copy_answers = answers[rows:]
    if len(own) != len(positions):
        raise RuntimeError(f"a text of {len(positions)} masks was answered {len(own)}; this is a bug")
    if plan.reads:
        own = [[_whole_sequence(p, plan, position, fill) for p in mask] for mask, position in zip(own, positions)]
    if not plan.has_words:
        return own
    result: TextPredictions = []
    start = 0
    for mask, position in enumerate(positions):
        scored: list[tuple[float, Prediction | tuple[int, ...]]] = [(p["score"], p) for p in own[mask]]
        for word in plan.words:
            end = start + len(word)
            scored.append((word_score(plan.copies[start:end], copy_answers[start:end]), word))
            start = end
        scored.sort(key=lambda candidate: candidate[0], reverse=True)  # stable: ties keep their order
        predictions: list[Prediction] = []
        for score, candidate in scored[: plan.query.top_k]:
            if isinstance(candidate, tuple):
                token_str, sequence = fill(plan.query.input_ids, position, candidate)
                candidate = Prediction(
                    score=score, token=candidate[0], token_str=token_str, sequence=sequence, tokens=list(candidate)
                )
            predictions.append(candidate)
        result.append(predictions)
    return result


def _whole_sequence(prediction: Prediction, plan: TextPlan, position: int, fill: FillWord) -> Prediction:
    """A window's prediction with the whole text's ``sequence``, as if the text were read whole."""
    filled = prediction.copy()
    filled["sequence"] = fill(plan.query.input_ids, position, (prediction["token"],))[1]
    return filled
