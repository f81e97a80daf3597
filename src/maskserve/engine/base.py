"""What every backend shares: :class:`FillMaskEngine` (tokenization, targets, top-k, the filled-in
``sequence``, describe()), padding, and the probe texts. Loading is pretrained.py's, the thread
policy threads.py's.

A backend only computes the logits at the mask rows (torch.py, onnxruntime.py). Every method but
:meth:`FillMaskEngine.predict` is cheap and thread-safe; ``predict`` must only run on the single
inference thread.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import transformers

from maskserve.engine.cpu import describe_features, precision_in_effect
from maskserve.engine.pretrained import check_tokenizer, max_tokens
from maskserve.engine.spliced_decode import SplicedText
from maskserve.engine.threads import ThreadPolicy
from maskserve.engine.word_pieces import whole_words, word_pieces
from maskserve.model_api import Prediction, Progress, Query, TextPredictions, WordPieces, Words

log = logging.getLogger(__name__)


def pad_batch(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids and their attention mask (from lengths: a text may hold a pad token)."""
    longest = max(len(s) for s in sequences)
    ids = np.full((len(sequences), longest), pad_token_id, dtype=np.int64)
    attention = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        attention[row, : len(seq)] = 1
    return ids, attention


# The bytes of one prediction's JSON besides its two texts: '{"score": ' and the other keys and
# quotes (about 60), a score written in full ("2.2250738585072014e-308"), a token id, and the ", "
# and brackets between predictions and masks; rounded up.
PREDICTION_JSON_OVERHEAD = 128
# How a text is tokenized: its ids alone; and no warning for a text longer than the model reads,
# which the server reads in windows (tasks/windows.py), never whole.
ENCODE_OPTIONS: dict[str, Any] = {"return_attention_mask": False, "return_token_type_ids": False, "verbose": False}
# Texts longer than this many tokens are decoded in segments when filled (spliced_decode.py): below
# it, decoding the whole text costs about as much as decoding it once in segments does.
SPLICE_FROM_TOKENS = 256


def piece_json_bytes(tokenizer: Any) -> np.ndarray:
    """Per token id, the JSON bytes of its piece plus one (a space): what it can add to a decoded text.

    Decoding writes each token as at most its piece (WordPiece drops ``##``, byte-level BPE and
    SentencePiece turn several piece characters into one) and one space; JSON writes every
    non-ASCII character as an escape, which only grows a piece's own bytes.
    """
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    longest = max((len(json.dumps(p)) for p in pieces if isinstance(p, str)), default=16)
    return np.array([len(json.dumps(p)) - 1 if isinstance(p, str) else longest for p in pieces], dtype=np.int64)


def probe_texts(tokenizer: Any) -> list[tuple[int, ...]]:
    """Token ids a backend checks itself on: two masks in one text, and a shorter text that pads."""
    m = tokenizer.mask_token
    return [
        tuple(tokenizer(text, return_attention_mask=False, return_token_type_ids=False)["input_ids"])
        for text in (f"a probe {m} sentence for the {m} head.", f"the {m} one.")
    ]


def specials_around(tokenizer: Any) -> tuple[int, int]:
    """How many special tokens ``tokenizer`` puts before and after a text's own tokens."""
    inner = tokenizer("hello", add_special_tokens=False, **ENCODE_OPTIONS)["input_ids"]
    whole = tokenizer("hello", **ENCODE_OPTIONS)["input_ids"]
    for before in range(len(whole) - len(inner) + 1):
        if whole[before : before + len(inner)] == inner:
            return before, len(whole) - len(inner) - before
    raise ValueError("the tokenizer's special tokens change the text's own tokens; maskserve cannot window its texts")


def answered_masks(queries: Sequence[Query], rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mask positions ``(rows, cols)`` whose answers are read: a query with
    ``answer_positions`` reads those masks alone, so the head need not run at its other masks (a
    scoring copy's rest of the word, a long text's masks that another window answers: context,
    not questions).
    """
    asked = [None if q.answer_positions is None else frozenset(q.answer_positions) for q in queries]
    if all(positions is None for positions in asked):
        return rows, cols
    # A batch holds a few masks a text: a loop over them costs less than building index arrays.
    keep = np.fromiter(
        ((wanted := asked[row]) is None or col in wanted for row, col in zip(rows.tolist(), cols.tolist())),
        dtype=bool,
        count=len(rows),
    )
    return (rows, cols) if keep.all() else (rows[keep], cols[keep])


class IndexTensors:
    """Each target list's index tensor, built once per list object.

    A whole-word search sends every row the same long tuple of ids (a word class): hashing its
    tens of thousands of ids for a cache key on every row cost more than the row's top-k. So the
    key is the tuple's identity; each entry keeps its tuple, so that an identity is never reused
    while its entry lives, and the oldest entry goes first past ``size``. Used on the inference
    thread only."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[int, tuple[tuple[int, ...], torch.Tensor]] = OrderedDict()

    def __call__(self, ids: tuple[int, ...]) -> torch.Tensor:
        entry = self._entries.get(id(ids))
        if entry is not None and entry[0] is ids:
            return entry[1]
        tensor = torch.tensor(ids, dtype=torch.long)
        self._entries[id(ids)] = (ids, tensor)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return tensor


class FillMaskEngine:
    """What every backend shares: a tokenizer, and answers to batches of :class:`Query`.

    A backend implements :meth:`_mask_logits` (the logits at the mask positions of a padded
    batch) and :meth:`_describe_backend`; everything else, from token ids to the pipeline's
    answer shape, is here, once.
    """

    backend: ClassVar[str]

    def __init__(
        self,
        tokenizer: Any,
        config: Any,
        *,
        name: str,
        device: torch.device,
        threads: ThreadPolicy,
        architecture: str,
        dtype: str,
    ) -> None:
        check_tokenizer(tokenizer, name)
        self.tokenizer = tokenizer
        self.name = name
        self.device = device
        self.threads = threads
        self.architecture = architecture
        self.dtype = dtype
        self.mask_token: str = tokenizer.mask_token
        self.mask_token_id: int = tokenizer.mask_token_id
        self.pad_token_id: int = tokenizer.pad_token_id
        self.max_tokens = max_tokens(config, tokenizer)
        self.specials_around = specials_around(tokenizer)
        self._vocab: dict[str, int] = tokenizer.get_vocab()
        # A plain list: a request's bound is a sum over a few dozen ids, which numpy's per-call
        # overhead would cost more than.
        pieces = piece_json_bytes(tokenizer)
        self._piece_bytes: list[int] = pieces.tolist()
        self._longest_piece = int(pieces.max()) if pieces.size else 0
        # A long text's segments, kept while its answer's candidates are decoded: a request's fold
        # asks for one text many times in a row, and a few requests' folds may interleave.
        self._spliced = functools.lru_cache(maxsize=16)(self._splice)
        # A whole-word search asks every row for the same long list of ids (the word classes): its
        # index tensor is built once, not per row.
        self._target_index = IndexTensors(size=8)
        # A single token's text, as the pipeline's token_str decodes it: a search's rows ask the
        # same pieces again and again.
        self._token_str = functools.lru_cache(maxsize=None)(self._decode_token)
        # Filled in by the loader, for /info and the load-time metric.
        self.source: str = name
        self.load_seconds: float | None = None

    # -- cheap, thread-safe helpers (used before a request is queued) -----------------------

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of ``text`` with special tokens, as the pipeline tokenizes it."""
        ids: list[int] = self.tokenizer(text, **ENCODE_OPTIONS)["input_ids"]
        return tuple(ids)

    def encode_words(self, text: str) -> Words:
        """Token ids of ``text`` with special tokens, and each token's word (None: a special token)."""
        encoding = self.tokenizer(text, **ENCODE_OPTIONS)
        return tuple(encoding["input_ids"]), tuple(encoding.word_ids())

    def count_masks(self, input_ids: Sequence[int]) -> int:
        return sum(1 for i in input_ids if i == self.mask_token_id)

    def resolve_targets(self, targets: Sequence[str]) -> tuple[int, ...]:
        """Vocabulary ids for ``targets``, as the pipeline picks them.

        A word outside the vocabulary stands for its first sub-token; one that tokenizes to
        nothing is dropped. Duplicates are removed. May return an empty tuple.
        """
        return tuple(dict.fromkeys(word[0] for word in self.target_tokens(targets) if word))

    def target_tokens(self, targets: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """Each target's token ids, tokenized as the pipeline tokenizes a target for its first token:
        a vocabulary entry is its one id; anything else is tokenized as written, without special
        tokens, so a byte-level BPE target keeps or lacks its leading space as given (" york", not
        "york", is the word after a space). Empty for a target that tokenizes to nothing.
        """
        words: list[tuple[int, ...]] = []
        for target in targets:
            id_ = self._vocab.get(target)
            if id_ is not None:
                words.append((id_,))
                continue
            # No truncation (the pipeline's max_length=1 keeps the first token only): setting it
            # changes the shared tokenizer's state, which would race the inference thread's decoding.
            pieces = self.tokenizer(
                target, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False
            )["input_ids"]
            words.append(tuple(pieces))
        return tuple(words)

    @functools.cached_property
    def _word_pieces(self) -> WordPieces:
        return word_pieces(self.tokenizer)

    def word_pieces(self) -> WordPieces:
        """The vocabulary's word classes (word_pieces.py), computed on first use."""
        return self._word_pieces

    def whole_words(self, words: Sequence[Sequence[int]]) -> list[bool]:
        """Which piece sequences are whole words (word_pieces.py)."""
        return whole_words(self.tokenizer, words)

    def fill_word(self, input_ids: Sequence[int], position: int, word: Sequence[int]) -> tuple[str, str]:
        """The word's text and the text with it put in at ``position``, decoded as a single
        token's ``token_str`` and ``sequence`` are (see :meth:`_filled_sequence`).

        A long text (one read in windows) is decoded once in segments, and each word costs the
        decoding of its mask's segment alone (see spliced_decode.py)."""
        token_str: str = self.tokenizer.decode(list(word))
        if len(input_ids) <= SPLICE_FROM_TOKENS:
            single_mask = self.count_masks(input_ids) == 1
            return token_str, self._filled_sequence(input_ids, position, word, single_mask)
        return token_str, self._spliced(tuple(input_ids)).filled(position, word)

    def _splice(self, input_ids: tuple[int, ...]) -> SplicedText:
        """``input_ids`` cut around its masks and decoded once, as :meth:`_filled_sequence` decodes."""
        masks = [i for i, token in enumerate(input_ids) if token == self.mask_token_id]
        return SplicedText(input_ids, masks, functools.partial(self._decoded, single_mask=len(masks) == 1))

    def prediction_bytes(self, input_ids: Sequence[int]) -> int:
        """At most how many bytes one prediction for this text takes in the JSON answer.

        Its ``sequence`` decodes the text with one token swapped in; decoding never writes more
        than each token's own piece plus a space (see :func:`piece_json_bytes`). The rest is the
        keys, the score, the id and ``token_str``, one piece at most.
        """
        pieces, longest = self._piece_bytes, self._longest_piece
        size = len(pieces)
        text = sum(pieces[i] if 0 <= i < size else longest for i in input_ids)
        return PREDICTION_JSON_OVERHEAD + 2 * longest + text

    def describe(self) -> dict[str, str | int | float]:
        """How the model runs, for ``/info`` and the metrics: the HTTP side never imports torch."""
        description: dict[str, str | int | float] = {
            "source": self.source,
            "backend": self.backend,
            "architecture": self.architecture,
            "device": str(self.device),
            "dtype": self.dtype,
            # What an operator choosing a precision needs: the CPU's matrix units, and whether
            # bfloat16 runs on them or is emulated.
            "precision": precision_in_effect(self.dtype, str(self.device)),
            "cpu_matrix_features": describe_features(),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            **self._describe_backend(),
        }
        if self.load_seconds is not None:
            description["load_seconds"] = self.load_seconds
        return description

    # -- the inference thread only ------------------------------------------------------------

    @torch.inference_mode()
    def predict(self, queries: Sequence[Query], progress: Progress | None = None) -> list[TextPredictions]:
        """Answer every query in one forward pass: one :data:`TextPredictions` per query.

        After the pass, each text's predictions are picked and decoded in turn, mask by mask;
        ``progress`` is asked before each, so a text nobody waits for any more costs nothing
        further (its answer is an empty list).
        """
        if not queries:
            return []
        input_ids, attention_mask = self._pad([q.input_ids for q in queries])
        # Row-major, as torch.nonzero: masks in text order, texts in batch order.
        rows, cols = np.nonzero(input_ids == self.mask_token_id)
        # The pipeline writes a single mask's ``sequence`` without special tokens: counted before
        # the rows nobody reads are dropped.
        masks_per_text = np.bincount(rows, minlength=len(queries))
        rows, cols = answered_masks(queries, rows, cols)
        probs = self._mask_logits(input_ids, attention_mask, rows, cols).float().softmax(dim=-1).cpu()
        if progress is not None:
            progress.forward_done()
        # Each text's mask rows are one contiguous run of ``rows``, texts in batch order.
        bounds = np.searchsorted(rows, np.arange(len(queries) + 1)).tolist()
        results: list[TextPredictions] = []
        for index, query in enumerate(queries):
            text_result: TextPredictions = []
            single_mask = bool(masks_per_text[index] == 1)
            for mask_row in range(bounds[index], bounds[index + 1]):
                if progress is not None and not progress.wanted(index):
                    text_result = []
                    break
                predictions = self._top_predictions(query, probs[mask_row])
                if not query.read_by_server:
                    self._fill_sequences(query, int(cols[mask_row]), predictions, single_mask)
                text_result.append(predictions)
            results.append(text_result)
        return results

    def _mask_logits(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> torch.Tensor:
        """Logits at the mask positions ``(rows, cols)`` only: shape (number of masks, vocabulary)."""
        raise NotImplementedError

    def _describe_backend(self) -> dict[str, str | int | float]:
        """The backend's own part of :meth:`describe` (threads, head, versions, export)."""
        raise NotImplementedError

    def _pad(self, sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        return pad_batch(sequences, self.pad_token_id)

    def _top_predictions(self, query: Query, probs: torch.Tensor) -> list[Prediction]:
        candidates = probs
        if query.target_ids is not None:
            candidates = probs.index_select(0, self._target_index(query.target_ids))
        k = min(query.top_k, candidates.shape[0])
        values, indices = candidates.topk(k)
        predictions: list[Prediction] = []
        for value, index in zip(values.tolist(), indices.tolist()):
            token = query.target_ids[index] if query.target_ids is not None else index
            predictions.append(Prediction(score=value, token=token, token_str=self._token_str(token), sequence=""))
        return predictions

    def _decode_token(self, token: int) -> str:
        text: str = self.tokenizer.decode([token])
        return text

    def _fill_sequences(self, query: Query, position: int, predictions: list[Prediction], single_mask: bool) -> None:
        """Fill in ``sequence`` as the pipeline does: the text with this one candidate put in."""
        for prediction in predictions:
            prediction["sequence"] = self._filled_sequence(
                query.input_ids, position, (prediction["token"],), single_mask
            )

    def _filled_sequence(
        self, input_ids: Sequence[int], position: int, tokens: Sequence[int], single_mask: bool
    ) -> str:
        """The text with ``tokens`` in place of the mask at ``position``, decoded as the pipeline
        decodes a filled text: pad tokens stripped after filling, and special tokens (other masks
        among them) kept when the text has several masks."""
        return self._decoded((*input_ids[:position], *tokens, *input_ids[position + 1 :]), single_mask)

    def _decoded(self, ids: Sequence[int], single_mask: bool) -> str:
        """Token ids as a filled text's ``sequence`` decodes them: pads dropped, special tokens
        skipped when the text has one mask."""
        text: str = self.tokenizer.decode([i for i in ids if i != self.pad_token_id], skip_special_tokens=single_mask)
        return text
