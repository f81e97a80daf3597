"""The word classes and the whole-word check of each tokenizer family."""

from __future__ import annotations

import pytest

from maskserve.engine import FillMaskEngine


def ids(engine: FillMaskEngine, *pieces: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.convert_tokens_to_ids(list(pieces)))


def test_wordpiece_continuations_are_the_hash_pieces_and_no_special_token_is_in_either(
    wordpiece_engine: FillMaskEngine,
) -> None:
    classes = wordpiece_engine.word_pieces()
    (er,) = ids(wordpiece_engine, "##er")
    (car,) = ids(wordpiece_engine, "car")
    assert er in classes.continues and er not in classes.starts
    assert car in classes.starts and car not in classes.continues
    special = set(wordpiece_engine.tokenizer.all_special_ids)
    assert not special & (set(classes.starts) | set(classes.continues))


def test_a_word_is_whole_only_as_the_tokenizer_writes_it(wordpiece_engine: FillMaskEngine) -> None:
    engine = wordpiece_engine
    assert engine.whole_words([ids(engine, "car", "##er", "##s"), ids(engine, "car")]) == [True, True]
    # A continuation alone, and a special token, are no words.
    assert engine.whole_words([ids(engine, "##s"), ids(engine, "[MASK]", "##s")]) == [False, False]


def test_byte_level_words_after_a_space_or_not_and_never_two_words(roberta_engine: FillMaskEngine) -> None:
    engine = roberta_engine
    tokenizer = engine.tokenizer
    spaced = tuple(tokenizer(" paris", add_special_tokens=False)["input_ids"])
    bare = tuple(tokenizer("paris", add_special_tokens=False)["input_ids"])
    two = tuple(tokenizer(" paris.", add_special_tokens=False)["input_ids"])
    assert engine.whole_words([spaced, bare, two]) == [True, True, False]
    # The same text in other pieces than the tokenizer's own ("car ##pen ##ter" for "carpenter").
    letters = tuple(tokenizer.convert_tokens_to_ids(["Ġp", "a", "r", "i", "s"]))
    assert len(spaced) < 5 and engine.whole_words([letters]) == [False]
    classes = engine.word_pieces()
    assert spaced[0] in classes.starts and all(p in classes.continues for p in spaced[1:])


def test_broken_utf8_is_no_word(roberta_engine: FillMaskEngine) -> None:
    tokenizer = roberta_engine.tokenizer
    pieces = tuple(tokenizer(" é", add_special_tokens=False)["input_ids"])
    assert roberta_engine.whole_words([pieces]) == [True]
    if len(pieces) > 1:  # a character in byte pieces: its first byte alone is broken text
        assert roberta_engine.whole_words([pieces[:1]]) == [False] or tokenizer.decode(pieces[:1]).strip() == ""


@pytest.mark.parametrize("text", [" paris", " capital", " the"])
def test_sentencepiece_words_start_with_the_space_mark_a_bare_one_included(
    xlmr_engine: FillMaskEngine, text: str
) -> None:
    engine = xlmr_engine
    pieces = tuple(engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert engine.whole_words([pieces]) == [True]
    classes = engine.word_pieces()
    assert pieces[0] in classes.starts and all(p in classes.continues for p in pieces[1:])
    assert engine.tokenizer.convert_ids_to_tokens(pieces[0]).startswith("▁")
