"""Whole words: the best words for one mask, however many pieces each takes, by beam search.

A word of n pieces p_1..p_n fills a mask as whole-word targets do (whole_words.py): the mask
becomes n masks, and its score is the product over i of P(p_i | p_1..p_{i-1} in place, the rest
masked), each a softmax over the whole vocabulary. Words of every length are ranked together by
that probability.

The search runs in rounds, one per piece: round r asks, for every open prefix of r pieces of a
word of n > r pieces, the model's best next pieces (one row each: a copy of the text with the
prefix in place). Every length is searched at once, so n pieces take n rounds. Each length keeps
its ``beam`` best prefixes; a prefix whose probability is already below the k-th complete word
is dropped, as probabilities only shrink as pieces are added. With ``beam`` as wide as the
vocabulary, nothing else is dropped, and the answer is exact. Pure arithmetic: no model, no HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from maskserve.model_api import Query, TextPredictions, WordPieces

# A word may take this many pieces unless the request says otherwise: most words of English
# take 1 to 3 pieces in the vocabularies of the common models, and each more piece is a round more.
DEFAULT_MAX_WORD_PIECES = 3
# The most a request may ask for: each piece is a round, and the rows grow with its square.
MAX_WORD_PIECES = 6
# The search keeps this many prefixes per length: wide enough to find the exact top few words
# on most masks (benchmarks/whole_words.py measures how often), narrow enough to cost a few
# dozen rows per mask.
DEFAULT_WORD_BEAM = 16
MAX_WORD_BEAM = 1024

# Which piece sequences are whole words (the model's whole_words).
IsWords = Callable[[Sequence[tuple[int, ...]]], list[bool]]


@dataclass(frozen=True)
class Word:
    """A whole word found: its probability and its pieces."""

    score: float
    pieces: tuple[int, ...]


@dataclass(frozen=True)
class _Open:
    """A prefix of a word of ``length`` pieces, with its probability so far."""

    length: int
    prefix: tuple[int, ...]
    score: float


def rows_bound(max_pieces: int, beam: int) -> int:
    """The most rows one mask's search can ask, all rounds together: round 0 one per length,
    then round r at most ``beam`` per length longer than r."""
    return max_pieces + beam * max_pieces * (max_pieces - 1) // 2


class MaskSearch:
    """One mask's search, round by round: :meth:`queries` are the round's rows, :meth:`advance`
    takes their answers; once :attr:`done`, :attr:`words` holds the top ``top_k`` by score.

    ``input_ids`` is the text the mask is read in, ``position`` the mask's place in it; the text's
    other masks stay masked. A text too long for the model is read in windows, one per word length
    (``reads``: for each length, the window's ids and the mask's place in it), as whole-word
    targets of that length are, so that a word scores as it does as a target.
    """

    def __init__(
        self,
        input_ids: Sequence[int],
        position: int,
        mask_token_id: int,
        *,
        top_k: int,
        max_pieces: int,
        beam: int,
        pieces: WordPieces,
        is_words: IsWords,
        reads: Mapping[int, tuple[Sequence[int], int]] | None = None,
    ) -> None:
        own = (input_ids, position)
        # Per word length: the tokens before the mask, after it, and the mask's place.
        self._around: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = {}
        for length in range(1, max_pieces + 1):
            ids, place = (reads or {}).get(length, own)
            self._around[length] = (tuple(ids[:place]), tuple(ids[place + 1 :]), place)
        self.mask_token_id = mask_token_id
        self.top_k, self.beam = top_k, beam
        self.pieces = pieces
        self.is_words = is_words
        self.round = 0
        self.words: list[Word] = []
        self._open = [_Open(length, (), 1.0) for length in range(1, max_pieces + 1)]
        self._asked: list[_Open] = []

    @property
    def done(self) -> bool:
        return not self._open

    @property
    def longest_row(self) -> int:
        """The most tokens one of its rows can take: a word's pieces in place of the mask."""
        return max(len(before) + length + len(after) for length, (before, after, _) in self._around.items())

    def queries(self) -> list[Query]:
        """This round's rows: per open prefix, the text with the prefix in place and the rest of
        its word masked, read at the next piece, answered with the best next pieces of their class."""
        self._asked = list(self._open)
        targets = self.pieces.starts if self.round == 0 else self.pieces.continues
        return [self._query(prefix, targets) for prefix in self._asked]

    def _query(self, open_: _Open, targets: tuple[int, ...]) -> Query:
        rest = open_.length - len(open_.prefix)
        before, after, position = self._around[open_.length]
        # A last piece completes words: enough of them for the answer, whatever the beam.
        top_k = max(self.beam, self.top_k) if rest == 1 else self.beam
        return Query(
            input_ids=(*before, *open_.prefix, *([self.mask_token_id] * rest), *after),
            top_k=top_k,
            target_ids=targets,
            n_masks=1,
            answer_positions=(position + len(open_.prefix),),
            # Only the probabilities are read, here: no sequence to decode, no JSON to build.
            read_by_server=True,
        )

    def advance(self, answers: Sequence[TextPredictions]) -> None:
        """Take this round's answers (one per row of :meth:`queries`, in order): complete words are
        kept when they are whole words, prefixes grow, the beam and the bound prune them."""
        if len(answers) != len(self._asked):
            raise RuntimeError(f"{len(answers)} answers for {len(self._asked)} search rows; this is a bug")
        complete: list[Word] = []
        grown: dict[int, list[_Open]] = {}
        for open_, answer in zip(self._asked, answers):
            # An empty answer: nobody waits for it any more (the request is ending); nothing grows.
            for mask in answer[:1]:
                for prediction in mask:
                    score = open_.score * prediction["score"]
                    prefix = (*open_.prefix, prediction["token"])
                    if len(prefix) == open_.length:
                        complete.append(Word(score, prefix))
                    else:
                        grown.setdefault(open_.length, []).append(_Open(open_.length, prefix, score))
        self.words = self._best(complete)
        # A prefix bounds every completion of it: below the k-th word found, none can enter.
        floor = self.words[-1].score if len(self.words) == self.top_k else 0.0
        self._open = []
        for length in sorted(grown):
            kept = sorted(grown[length], key=lambda o: o.score, reverse=True)[: self.beam]
            self._open.extend(o for o in kept if o.score >= floor)
        self._asked = []
        self.round += 1

    def _best(self, complete: Sequence[Word]) -> list[Word]:
        """The top ``top_k`` of the words kept so far and the whole words among ``complete``.

        Checking a word (the tokenizer writes its text back) costs far more than the arithmetic, so
        candidates are checked best first, ``top_k`` at a time, and only while one could still
        enter: a candidate no better than the k-th word kept so far never would. The answer is the
        one checking them all would give. Sorts are stable: ties keep shorter words (kept from
        earlier rounds) first, then the model's order."""
        candidates = sorted(complete, key=lambda word: word.score, reverse=True)
        kept = list(self.words)
        for start in range(0, len(candidates), self.top_k):
            if len(kept) == self.top_k and candidates[start].score <= kept[-1].score:
                break
            chunk = candidates[start : start + self.top_k]
            valid = self.is_words([word.pieces for word in chunk])
            kept.extend(word for word, ok in zip(chunk, valid, strict=True) if ok)
            kept.sort(key=lambda word: word.score, reverse=True)
            del kept[self.top_k :]
        return kept
