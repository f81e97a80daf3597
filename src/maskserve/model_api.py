"""What the serving side needs from a model, with neither torch nor aiohttp.

The engine implements :class:`FillMaskModel`; the batcher and the views depend only on this
module, so tests can put a fault-injecting wrapper where the engine goes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, Protocol, TypedDict


class Prediction(TypedDict):
    """One candidate for one mask, exactly the fill-mask pipeline's dict; a whole-word target's
    (whole_words.py) also lists all its token ids, ``token`` being the first."""

    score: float
    token: int
    token_str: str
    sequence: str
    tokens: NotRequired[list[int]]


# One text's answer: one list of predictions per mask, in text order.
TextPredictions = list[list[Prediction]]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Which model to load, on which backend and how: what ``engine.load`` takes."""

    model: str | None  # a folder or hub id; None: the default model
    backend: str = "torch"
    # Where the graph backends keep their converted graphs.
    cache_dir: Path
    device: str = "cpu"
    dtype: str = "auto"
    threads: int = 1
    # Small batches on one torch thread (the torch backend only).
    adaptive_threads: bool = False
    quantize: str = "none"


@dataclass(frozen=True)
class Query:
    """One tokenized text to fill, with its own answer parameters."""

    input_ids: tuple[int, ...]
    top_k: int
    target_ids: tuple[int, ...] | None = None
    # How many mask tokens input_ids holds, as the parser counted them: with top_k and the
    # targets, it says how many predictions the text asks for, which is what its answer costs.
    n_masks: int = 1
    # The masks to answer, by their positions in input_ids, in text order (a scoring copy masks a
    # whole word's rest but reads one token; a window of a long text answers the masks it was cut
    # for, and leaves the others in it as context); None answers every mask.
    answer_positions: tuple[int, ...] | None = None
    # The server reads this answer itself and never sends it (a scoring copy): no ``sequence`` is
    # decoded (it stays empty) and no JSON is built, work that would be thrown away.
    read_by_server: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def predictions(self) -> int:
        """Predictions this text is answered with: top_k per mask, or fewer targets."""
        per_mask = self.top_k if self.target_ids is None else min(self.top_k, len(self.target_ids))
        return self.n_masks * per_mask

    @property
    def prediction_tokens(self) -> int:
        """Predictions x tokens: each prediction decodes the whole text again (its ``sequence``),
        unless the server reads the answer itself (no ``sequence``)."""
        return 0 if self.read_by_server else self.predictions * self.n_tokens


@dataclass(frozen=True)
class WordPieces:
    """A vocabulary's word classes (whole-word search): the ids that may start a word, and those
    that may continue one; special tokens are in neither."""

    starts: tuple[int, ...]
    continues: tuple[int, ...]


# A text's token ids with special tokens, and each token's word index (None for special tokens).
Words = tuple[tuple[int, ...], tuple[int | None, ...]]


class Progress(Protocol):
    """What the inference thread tells and asks while it answers a batch (the batcher implements it)."""

    def forward_done(self) -> None:
        """The forward pass is over; what follows is post-processing (top-k, decoding)."""
        ...

    def wanted(self, index: int) -> bool:
        """Whether query ``index`` of the batch still has someone waiting for its answer.

        Asked between texts and between masks: a text nobody waits for (its client left, its
        deadline passed) gets no more work, and an empty answer.
        """
        ...


def unwrap(predictions: TextPredictions) -> list[Prediction] | TextPredictions:
    """One text's answer as the pipeline shapes it: a text with one mask answers that mask's
    list, a text with several answers one list per mask.

    This is the one place the pipeline's per-text unwrapping lives (getting it wrong spreads one
    sentence's predictions over several callers); an answer to several texts is these, in a list.
    """
    return predictions[0] if len(predictions) == 1 else predictions


def copy_prediction(copy: Query, answer: TextPredictions, kind: str) -> Prediction:
    """The one prediction a copy (a scoring or whole-word copy: one read mask, its one target) was
    answered with; anything else is a bug in how the copy was built or answered."""
    if len(answer) != 1 or len(answer[0]) != 1:
        raise RuntimeError(f"a {kind} copy was answered {len(answer)} masks, not one; this is a bug")
    prediction = answer[0][0]
    if copy.target_ids is None or prediction["token"] != copy.target_ids[0]:
        raise RuntimeError(f"a {kind} copy was answered for another token than its own; this is a bug")
    return prediction


def text_answer_json(predictions: TextPredictions) -> bytes:
    """One text's answer (:func:`unwrap`) as JSON."""
    return json.dumps(unwrap(predictions)).encode()


class FillMaskModel(Protocol):
    """A loaded fill-mask model. Only :meth:`predict` is heavy; it runs on the inference thread."""

    name: str
    mask_token: str
    mask_token_id: int
    max_tokens: int
    # How many special tokens the tokenizer puts before and after a text ([CLS] and [SEP]: 1, 1):
    # a window of a long text keeps them around its own run of the text's tokens.
    specials_around: tuple[int, int]

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of ``text`` with special tokens."""
        ...

    def encode_words(self, text: str) -> Words:
        """Token ids of ``text`` with special tokens, and the word each token belongs to."""
        ...

    def count_masks(self, input_ids: Sequence[int]) -> int:
        """How many mask tokens ``input_ids`` holds."""
        ...

    def resolve_targets(self, targets: Sequence[str]) -> tuple[int, ...]:
        """Vocabulary ids for ``targets``, deduplicated; empty when none is usable."""
        ...

    def target_tokens(self, targets: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """Each target's token ids, in order: its one id when it is a vocabulary entry, else its
        tokens without special tokens (empty when it has none). The first of each is what
        :meth:`resolve_targets` picks."""
        ...

    def fill_word(self, input_ids: Sequence[int], position: int, word: Sequence[int]) -> tuple[str, str]:
        """``(token_str, sequence)`` of the tokens ``word`` put in at ``position`` (a mask), decoded
        as a single token's prediction is: the word's own text, and the whole text with it in."""
        ...

    def word_pieces(self) -> WordPieces:
        """Which vocabulary ids start a word and which continue one (computed once, cached)."""
        ...

    def whole_words(self, words: Sequence[Sequence[int]]) -> list[bool]:
        """For each piece sequence, whether it is a word the tokenizer itself writes so, in one
        word, with valid text: the whole-word search offers only these."""
        ...

    def predict(self, queries: Sequence[Query], progress: Progress | None = None) -> list[TextPredictions]:
        """One :data:`TextPredictions` per query, in order, from one forward pass (a query with
        ``answer_positions`` gets those masks' predictions alone).

        With ``progress``, the model reports the end of the forward pass and skips the rest of the
        work for any query no longer wanted (its answer is then an empty list).
        """
        ...

    def prediction_bytes(self, input_ids: Sequence[int]) -> int:
        """At most how many bytes one prediction for this text takes in the JSON answer (its
        ``sequence`` repeats the whole text): a bound known before any work is done."""
        ...

    def describe(self) -> dict[str, str | int | float]:
        """How the model runs (device, dtype, torch threads, versions, load_seconds), for ``/info``.

        Cheap and thread-safe. Test doubles may lack it: callers use :func:`describe_model`.
        """
        ...


def describe_model(model: FillMaskModel) -> dict[str, str | int | float]:
    """``model.describe()``, or an empty description for a model (a test double) without one."""
    describe = getattr(model, "describe", None)
    return dict(describe()) if callable(describe) else {}
