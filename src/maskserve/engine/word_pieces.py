"""What a whole word is, for a tokenizer: which pieces start a word and which continue one, and
whether a piece sequence is a word the tokenizer itself would write (tasks/word_search.py searches
them). Tokenizer only: no torch.

The three families maskserve serves mark words differently: WordPiece marks a continuation
(``##ing``), byte-level BPE a word after a space (``Ġcar``), SentencePiece a word's start (``▁car``,
or a bare ``▁`` before pieces). The classes only narrow what the search asks the model for; what
makes a word is :func:`whole_words`: the tokenizer's own tokenization of the word's text is
exactly its pieces, in one pre-tokenizer word, with no broken character.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from maskserve.model_api import WordPieces

# What a broken UTF-8 sequence decodes to: a byte piece cut out of a character.
REPLACEMENT = "\ufffd"


def word_pieces(tokenizer: Any) -> WordPieces:
    """The vocabulary's ids that may start a word and those that may continue one, special and
    added tokens excluded."""
    pieces: list[str] = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    excluded = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    ids = [i for i, piece in enumerate(pieces) if i not in excluded and isinstance(piece, str) and piece]
    if model.get("type") == "WordPiece":
        prefix = model.get("continuing_subword_prefix") or "##"
        continues = tuple(i for i in ids if pieces[i].startswith(prefix) and len(pieces[i]) > len(prefix))
        starts = tuple(i for i in ids if not pieces[i].startswith(prefix))
        return WordPieces(starts, continues)
    spaced = sum(pieces[i].startswith("▁") for i in ids)
    if spaced > sum(pieces[i].startswith("Ġ") for i in ids):
        # SentencePiece: every word starts with the space mark (a text's first word too).
        return WordPieces(
            tuple(i for i in ids if pieces[i].startswith("▁")), tuple(i for i in ids if not pieces[i].startswith("▁"))
        )
    # Byte-level BPE: a word after a space starts with its mark, one at a text's start or after a
    # bracket does not, so any piece may start one.
    return WordPieces(tuple(ids), tuple(i for i in ids if not pieces[i].startswith("Ġ")))


def whole_words(tokenizer: Any, words: Sequence[Sequence[int]]) -> list[bool]:
    """For each piece sequence, whether it is a whole word: its text tokenizes to exactly these
    pieces (so ``car ##pen ##ter`` is not one where ``carpenter`` is a piece), as one word of the
    pre-tokenizer, with no broken character."""
    if not words:
        return []
    texts = [tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(list(word))) for word in words]
    tokenized = tokenizer(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)
    backend = tokenizer.backend_tokenizer
    result: list[bool] = []
    for word, text, ids in zip(words, texts, tokenized["input_ids"]):
        ok = bool(text.strip()) and REPLACEMENT not in text and list(ids) == list(word)
        if ok and len(word) > 1 and backend.pre_tokenizer is not None:
            normal = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
            ok = len(backend.pre_tokenizer.pre_tokenize_str(normal)) == 1
        result.append(ok)
    return result
