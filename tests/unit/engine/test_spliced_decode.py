"""A long text filled by splicing its mask's segment equals the whole text decoded, on every tokenizer."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from maskserve.engine import FillMaskEngine
from maskserve.engine.spliced_decode import CONTEXT, SplicedText


def long_text(engine: FillMaskEngine, masks: int) -> tuple[int, ...]:
    """About 600 tokens of words, punctuation and contractions, with ``masks`` masks spread over it."""
    words = "the dog don't ran , in the park . paris is the capital of france ! a cat's toy ?".split()
    rng = random.Random(masks)
    text = [rng.choice(words) for _ in range(500)]
    for position in rng.sample(range(len(text)), masks):
        text[position] = engine.mask_token
    return engine.encode(" ".join(text))


@pytest.mark.parametrize("model", ["bert", "roberta", "xlmr"])
@pytest.mark.parametrize("masks", [1, 3])
def test_a_filled_long_text_equals_the_whole_text_decoded(
    request: pytest.FixtureRequest, model: str, masks: int
) -> None:
    # Decoding is the tokenizer's, the same on every backend: the torch engines'.
    engine: FillMaskEngine = request.getfixturevalue(f"{model}_engine")
    ids = long_text(engine, masks)
    positions = [i for i, token in enumerate(ids) if token == engine.mask_token_id]
    assert len(ids) > 256 and len(positions) == masks
    rng = random.Random(0)
    vocabulary = range(5, len(engine.tokenizer))
    for position in positions:
        for tokens in [(rng.choice(vocabulary),) for _ in range(20)] + [tuple(rng.sample(vocabulary, 3))]:
            expected = engine._filled_sequence(ids, position, tokens, masks == 1)
            assert engine.fill_word(ids, position, tokens)[1] == expected
    assert engine._spliced(ids).joins is not None, "the segments joined back: the fast path was the one tested"


def test_segments_surround_each_position_and_cover_the_text() -> None:
    ids = tuple(range(100))
    spliced = SplicedText(ids, [50, 20, 55], lambda part: " ".join(map(str, part)))
    assert spliced.bounds == [(0, 12), (12, 29), (29, 42), (42, 64), (64, 100)]
    assert spliced.segment_of == {20: 1, 50: 3, 55: 3}
    assert all(start <= p - CONTEXT and p + CONTEXT < end for p, (start, end) in [(20, (12, 29)), (50, (42, 64))])
    assert spliced.joins == [(0, " ")] * 4
    assert spliced.filled(50, (-1, -2)) == " ".join(map(str, (*range(50), -1, -2, *range(51, 100))))


def test_a_text_whose_segments_do_not_join_back_is_decoded_whole() -> None:
    calls: list[int] = []

    def decode(part: Sequence[int]) -> str:
        calls.append(len(part))
        # Not local: a segment's text depends on its length, so the pieces never join into the whole.
        return f"<{len(part)}>"

    spliced = SplicedText(tuple(range(40)), [20], decode)
    assert spliced.joins is None
    assert spliced.filled(20, (7,)) == "<40>" and calls[-1] == 40
