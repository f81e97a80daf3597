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
            answer_position=position + i,
            # Only its probability is read, here: no sequence to decode, no JSON to build.
            read_by_server=True,
        )
        for i, token in enumerate(word)
    ]


@dataclass(frozen=True)
class TextPlan:
    """One text's work: its own query, and each mask's whole words as copies of it."""

    # The text's own query: every mask, its single-token targets (or none: no targets at all).
    query: Query
    words: tuple[tuple[int, ...], ...] = ()
    # Each mask's position in the text, in text order.
    positions: tuple[int, ...] = ()
    # Mask by mask, word by word, token by token.
    copies: tuple[Query, ...] = ()

    @property
    def has_words(self) -> bool:
        return bool(self.words)

    @property
    def asks_own(self) -> bool:
        """Whether the text's own query is queued: not when every target is a whole word."""
        return not self.has_words or bool(self.query.target_ids)

    @property
    def queries(self) -> tuple[Query, ...]:
        """What this text queues, its own query first."""
        return ((self.query,) if self.asks_own else ()) + self.copies

    @property
    def word_predictions(self) -> int:
        """Whole-word candidates this text's answer may hold: per mask, all its words (the cut to
        top_k comes after scoring)."""
        return len(self.positions) * len(self.words)

    @property
    def answer_predictions(self) -> int:
        """Predictions in this text's answer: per mask, top_k of its single tokens and words."""
        if not self.has_words:
            return self.query.predictions
        single = len(self.query.target_ids or ())
        return len(self.positions) * min(self.query.top_k, single + len(self.words))


def plan_text(query: Query, targets: Targets | None, mask_token_id: int) -> TextPlan:
    """A text's plan: its query alone, or with the copies that score each whole word on each mask."""
    if targets is None or not targets.words:
        return TextPlan(query)
    positions = tuple(i for i, token in enumerate(query.input_ids) if token == mask_token_id)
    copies = tuple(
        copy
        for position in positions
        for word in targets.words
        for copy in word_copies(query.input_ids, mask_token_id, position, word)
    )
    return TextPlan(query, targets.words, positions, copies)


def word_score(copies: Sequence[Query], answers: Sequence[TextPredictions]) -> float:
    """The chain rule's product: each copy's answer is its one token's probability."""
    score = 1.0
    for copy, answer in zip(copies, answers, strict=True):
        score *= copy_prediction(copy, answer, "whole-word")["score"]
    return score


def text_predictions(plan: TextPlan, answers: Sequence[TextPredictions], fill: FillWord) -> TextPredictions:
    """The text's answer from its queries' (:attr:`TextPlan.queries`, in order): per mask, its
    single-token candidates and its whole words by score, top_k kept.

    Only the words kept are decoded (``fill``). Ties keep single tokens first, then words in the
    order the request named them.
    """
    if len(answers) != len(plan.queries):
        raise RuntimeError(f"{len(answers)} answers for a text of {len(plan.queries)} queries; this is a bug")
    if not plan.has_words:
        return answers[0]
    own = answers[0] if plan.asks_own else [[] for _ in plan.positions]
    copy_answers = answers[1:] if plan.asks_own else answers
    if len(own) != len(plan.positions):
        raise RuntimeError(f"a text of {len(plan.positions)} masks was answered {len(own)}; this is a bug")
    result: TextPredictions = []
    start = 0
    for mask, position in enumerate(plan.positions):
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
