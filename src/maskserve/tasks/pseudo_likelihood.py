"""Pseudo-log-likelihood scoring: a text as masked copies of itself, and their answers summed.

Each scored token (every token but the special ones) gets one copy of the text with it masked
(``original``), or with it and the rest of its word to its right masked (``within_word_l2r``).
Each copy is an ordinary fill-mask :class:`~maskserve.model_api.Query` whose one target is the
true token, so it is queued, priced and batched like any text; a copy's answer is the true token's
probability, whose natural log is that token's score. A text longer than the model reads is
copied window by window (windows.py): each scored token's copy is the window that holds it, with
the token masked. Pure arithmetic: no model, no HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from maskserve.model_api import Query, TextPredictions, Words, copy_prediction
from maskserve.tasks.windows import Layout, fits, windows

Metric = Literal["original", "within_word_l2r"]
# The score of a token whose probability underflowed to zero, and the least a text's score can be:
# -inf in arithmetic, written as the most negative float so that the JSON stays valid.
LOWEST_SCORE = -1.7976931348623157e308
METRICS: tuple[Metric, ...] = ("original", "within_word_l2r")


class TokenScore(TypedDict):
    """One scored token: its id, its text, and its natural log-probability with it masked."""

    token: int
    token_str: str
    score: float


@dataclass(frozen=True)
class TextScore:
    """A text's pseudo-log-likelihood and the log-probability of each scored token, in text order."""

    score: float
    tokens: list[TokenScore]


def scored_positions(words: Words) -> list[int]:
    """The positions a text is scored at: every token that belongs to a word (not a special token)."""
    return [position for position, word in enumerate(words[1]) if word is not None]


def masked_positions(words: Words, position: int, metric: Metric) -> list[int]:
    """The positions masked to score the token at ``position``: it alone, or it and the rest of its word."""
    if metric == "original":
        return [position]
    word_ids = words[1]
    end = position + 1
    while end < len(word_ids) and word_ids[end] is not None and word_ids[end] == word_ids[position]:
        end += 1
    return list(range(position, end))


@dataclass(frozen=True)
class ScoredText:
    """A text's scoring copies, one per scored token in text order, and how many windows they read it in."""

    copies: tuple[Query, ...]
    windows: int = 1


def masked_copies(words: Words, mask_token_id: int, metric: Metric, layout: Layout) -> ScoredText:
    """One query per scored token, in text order: the copy with its mask(s), asking for the true
    token; of the whole text when the model reads it whole, else of the window that holds the token."""
    input_ids, word_ids = words
    spans = [(position, masked_positions(words, position, metric)[-1]) for position in scored_positions(words)]
    if fits(len(input_ids), layout):
        return ScoredText(tuple(_copy(input_ids, mask_token_id, first, last) for first, last in spans))
    # A word longer than half a window (never in real text) is masked as far as a window reaches.
    spans = [(first, min(last, first + layout.reach - 1)) for first, last in spans]
    placed = windows(word_ids, spans, layout)
    copies = tuple(
        _copy(window.ids(input_ids, layout), mask_token_id, window.local(first, layout), window.local(last, layout))
        for window in placed
        for first, last in window.asked
    )
    return ScoredText(copies, len(placed))


def _copy(input_ids: Sequence[int], mask_token_id: int, first: int, last: int) -> Query:
    """The copy of ``input_ids`` with ``first`` to ``last`` masked, asking for the true token at ``first``."""
    ids = list(input_ids)
    target = ids[first]
    ids[first : last + 1] = [mask_token_id] * (last + 1 - first)
    return Query(
        input_ids=tuple(ids),
        top_k=1,
        target_ids=(target,),
        # One answer is read, whatever the number of masks: that is what the copy costs.
        n_masks=1,
        answer_positions=(first,),
        read_by_server=True,
    )


def text_score(copies: Sequence[Query], answers: Sequence[TextPredictions]) -> TextScore:
    """The text's score from its copies' answers, one per copy, in order.

    Each answer is the one mask's one prediction, the true token's probability. A probability
    that underflows to zero has no log: its score is ``-inf`` in arithmetic, written as the most
    negative float so that the JSON stays valid.
    """
    tokens: list[TokenScore] = []
    for copy, answer in zip(copies, answers, strict=True):
        prediction = copy_prediction(copy, answer, "scoring")
        log_p = math.log(prediction["score"]) if prediction["score"] > 0 else LOWEST_SCORE
        tokens.append(TokenScore(token=prediction["token"], token_str=prediction["token_str"], score=log_p))
    return TextScore(score=total_score([t["score"] for t in tokens]), tokens=tokens)


def total_score(scores: Sequence[float]) -> float:
    """The exact sum of a text's token scores; :data:`LOWEST_SCORE` when it is below any float
    (two underflowed tokens), which ``math.fsum`` reports by raising."""
    try:
        return max(math.fsum(scores), LOWEST_SCORE)
    except OverflowError:
        return LOWEST_SCORE


def text_scores(per_text: Sequence[Sequence[Query]], answers: Sequence[TextPredictions]) -> list[TextScore]:
    """Each text's score, from the answers to all texts' copies in one list, in the same order."""
    scores: list[TextScore] = []
    start = 0
    for copies in per_text:
        scores.append(text_score(copies, answers[start : start + len(copies)]))
        start += len(copies)
    if start != len(answers):
        raise RuntimeError(f"{len(answers)} answers for {start} scoring copies; this is a bug")
    return scores
