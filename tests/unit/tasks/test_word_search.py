"""The whole-word search, held to a brute-force oracle on a tiny model of each tokenizer family.

The oracle scores every sequence of up to three non-special pieces at a mask by the chain rule,
with the Hugging Face model itself (the mask replaced by n masks; piece i read with pieces 1..i-1
in place, a softmax over the whole vocabulary), then walks them from the most probable down,
keeping those the tokenizer writes so as one word, until it has top_k. The search, with a beam
wide enough to hold every prefix, must return exactly those words and scores.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from maskserve.engine import FillMaskEngine
from maskserve.model_api import Query, TextPredictions, WordPieces
from maskserve.tasks.whole_words import word_copies
from maskserve.tasks.word_search import DEFAULT_WORD_BEAM, MaskSearch, Word, rows_bound

# Absolute, on products of float32 probabilities: the engine reads the last layer at the asked
# rows only, the oracle runs the whole model.
TOLERANCE = 1e-5
FAMILIES = ("wordpiece", "roberta", "xlmr")
# Wider than every prefix of the tiny models' words: nothing is cut but by the bound.
WIDE = 10**6


def search(engine: FillMaskEngine, text: str, *, top_k: int, beam: int, mask: int = 0, pieces: int = 3) -> list[Word]:
    """The search on ``text``'s ``mask``-th mask, its rounds answered by the engine."""
    ids = engine.encode(text)
    position = [i for i, t in enumerate(ids) if t == engine.mask_token_id][mask]
    found = MaskSearch(
        ids,
        position,
        engine.mask_token_id,
        top_k=top_k,
        max_pieces=pieces,
        beam=beam,
        pieces=engine.word_pieces(),
        is_words=engine.whole_words,
    )
    while not found.done:
        queries = found.queries()
        found.advance(engine.predict(queries))
    return found.words


@functools.cache
def hf(folder: Path) -> tuple[Any, Any]:
    return AutoTokenizer.from_pretrained(str(folder)), AutoModelForMaskedLM.from_pretrained(str(folder)).eval()


def probabilities(model: Any, rows: torch.Tensor, read: int) -> torch.Tensor:
    """P(piece) at position ``read`` of each row, in chunks."""
    out = []
    with torch.inference_mode():
        for chunk in rows.split(8192):
            # The whole model, its head at the read position only (the rest would be thrown away).
            hidden = model.base_model(input_ids=chunk).last_hidden_state[:, read]
            head = model.lm_head if hasattr(model, "lm_head") else model.cls
            out.append(head(hidden).float().softmax(-1))
    return torch.cat(out)


def filled(before: list[int], after: list[int], prefixes: torch.Tensor, masks: int, mask_id: int) -> torch.Tensor:
    """One row per prefix (a row of ``prefixes``): the text with it in place, then ``masks`` masks."""
    n = prefixes.shape[0]
    parts = [
        torch.tensor(before).expand(n, -1),
        prefixes,
        torch.full((n, masks), mask_id),
        torch.tensor(after).expand(n, -1),
    ]
    return torch.cat(parts, dim=1)


@functools.cache
def chain_rule(folder: Path, ids: tuple[int, ...], position: int, mask_id: int) -> tuple[torch.Tensor, ...]:
    """Every sequence of 1, 2 and 3 pieces at ``position``, scored by the chain rule: one tensor
    per length (index = the pieces), special tokens scored 0."""
    tokenizer, model = hf(folder)
    before, after, m = list(ids[:position]), list(ids[position + 1 :]), mask_id
    size = model.config.vocab_size
    special = torch.zeros(size, dtype=torch.bool)
    special[tokenizer.all_special_ids] = True
    none = torch.zeros((1, 0), dtype=torch.long)
    ones = torch.arange(size)[:, None]
    twos = torch.cartesian_prod(torch.arange(size), torch.arange(size))
    p1 = probabilities(model, filled(before, after, none, 1, m), position)[0]
    first = probabilities(model, filled(before, after, none, 2, m), position)[0]
    second = probabilities(model, filled(before, after, ones, 1, m), position + 1)
    two = first[:, None] * second
    first = probabilities(model, filled(before, after, none, 3, m), position)[0]
    second = probabilities(model, filled(before, after, ones, 2, m), position + 1)
    third = probabilities(model, filled(before, after, twos, 1, m), position + 2).view(size, size, size)
    three = first[:, None, None] * second[:, :, None] * third
    grids = []
    for length, grid in enumerate((p1, two, three), start=1):
        for axis in range(length):  # no special token anywhere in a word
            index: list[Any] = [slice(None)] * length
            index[axis] = special
            grid[tuple(index)] = 0.0
        grids.append(grid)
    return tuple(grids)


def mask_at(engine: FillMaskEngine, text: str, mask: int) -> tuple[tuple[int, ...], int]:
    ids = engine.encode(text)
    return ids, [i for i, t in enumerate(ids) if t == engine.mask_token_id][mask]


def oracle_score(folder: Path, engine: FillMaskEngine, text: str, word: tuple[int, ...], mask: int = 0) -> float:
    ids, position = mask_at(engine, text, mask)
    return float(chain_rule(folder, ids, position, engine.mask_token_id)[len(word) - 1][word])


def oracle(folder: Path, engine: FillMaskEngine, text: str, top_k: int, mask: int = 0) -> list[Word]:
    ids, position = mask_at(engine, text, mask)
    candidates: list[Word] = []
    for grid in chain_rule(folder, ids, position, engine.mask_token_id):
        flat = grid.flatten()
        values, indices = flat.topk(min(20000, flat.numel()))
        for value, index in zip(values.tolist(), indices.tolist()):
            word = tuple(int(i) for i in torch.unravel_index(torch.tensor(index), grid.shape))
            candidates.append(Word(value, word))
    candidates.sort(key=lambda w: w.score, reverse=True)
    found: list[Word] = []
    for start in range(0, len(candidates), 512):
        chunk = candidates[start : start + 512]
        found.extend(w for w, ok in zip(chunk, engine.whole_words([w.pieces for w in chunk])) if ok)
        if len(found) >= top_k:
            break
    assert len(found) >= top_k, "the oracle's walk ended before top_k words"
    return found[:top_k]


def assert_same_words(got: list[Word], expected: list[Word]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.score == pytest.approx(e.score, abs=TOLERANCE)
    # The same words; two whose scores tie within the tolerance may come in either order.
    assert {w.pieces for w in got} == {w.pieces for w in expected} or all(
        abs(g.score - e.score) <= TOLERANCE for g, e in zip(got, expected) if g.pieces != e.pieces
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("many", [False, True], ids=["top5", "past-one-piece-words"])
def test_a_wide_beam_finds_exactly_the_oracles_top_words(
    family: str, many: bool, request: pytest.FixtureRequest
) -> None:
    folder: Path = request.getfixturevalue(f"{family}_dir")
    engine: FillMaskEngine = request.getfixturevalue(f"{family}_engine")
    # Past every one-piece word, so that words of two and three pieces must be ranked in.
    top_k = len(engine.word_pieces().starts) + 30 if many else 5
    text = f"the {engine.mask_token} sat on the house ."
    got = search(engine, text, top_k=top_k, beam=WIDE)
    expected = oracle(folder, engine, text, top_k)
    assert_same_words(got, expected)
    if many:
        assert max(len(w.pieces) for w in expected) > 1, "the answer holds words of several pieces"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_default_beam_scores_every_word_it_returns_exactly(family: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(f"{family}_dir")
    engine: FillMaskEngine = request.getfixturevalue(f"{family}_engine")
    text = f"the {engine.mask_token} sat on the house ."
    top_k = len(engine.word_pieces().starts) + 30
    got = search(engine, text, top_k=top_k, beam=DEFAULT_WORD_BEAM)
    assert max(len(w.pieces) for w in got) > 1
    for word in got:
        assert word.score == pytest.approx(oracle_score(folder, engine, text, word.pieces), abs=TOLERANCE)
    assert engine.whole_words([w.pieces for w in got]) == [True] * len(got)


EDGES = {
    "at the start": "{m} sat on the house .",
    "before punctuation": "the cat sat on the {m}.",
    "two side by side, the first": "the {m}{m} sat on the house .",
    "multi-byte characters": "the café {m} sat on the house ü .",
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("edge", EDGES)
def test_edge_cases_match_the_oracle(family: str, edge: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(f"{family}_dir")
    engine: FillMaskEngine = request.getfixturevalue(f"{family}_engine")
    text = EDGES[edge].format(m=engine.mask_token)
    assert_same_words(search(engine, text, top_k=5, beam=WIDE), oracle(folder, engine, text, 5))


def test_the_second_of_two_masks_side_by_side_is_searched_with_the_first_masked(
    wordpiece_dir: Path, wordpiece_engine: FillMaskEngine
) -> None:
    text = "the [MASK] [MASK] sat on the house ."
    got = search(wordpiece_engine, text, top_k=5, beam=WIDE, mask=1)
    assert_same_words(got, oracle(wordpiece_dir, wordpiece_engine, text, 5, mask=1))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_words_score_equals_its_targets_score_and_a_one_piece_words_the_plain_fills(
    family: str, request: pytest.FixtureRequest
) -> None:
    engine: FillMaskEngine = request.getfixturevalue(f"{family}_engine")
    text = f"the {engine.mask_token} sat on the house ."
    ids, position = mask_at(engine, text, 0)
    got = search(engine, text, top_k=len(engine.word_pieces().starts) + 30, beam=DEFAULT_WORD_BEAM)
    plain = {p["token"]: p["score"] for p in engine.predict([Query(ids, top_k=10**6)])[0][0]}
    for word in got:
        copies = word_copies(ids, engine.mask_token_id, position, word.pieces)
        targets = 1.0
        for answer in engine.predict(copies):
            targets *= answer[0][0]["score"]
        assert word.score == pytest.approx(targets, rel=1e-6)
        if len(word.pieces) == 1:
            assert word.score == pytest.approx(plain[word.pieces[0]], rel=1e-6)


def test_the_rows_asked_stay_within_the_bound_and_pruned_prefixes_are_not_asked(
    wordpiece_engine: FillMaskEngine,
) -> None:
    engine = wordpiece_engine
    ids, position = mask_at(engine, "the [MASK] sat on the house .", 0)
    for top_k, beam in ((1, 4), (5, 16), (50, 3)):
        found = MaskSearch(
            ids,
            position,
            engine.mask_token_id,
            top_k=top_k,
            max_pieces=3,
            beam=beam,
            pieces=engine.word_pieces(),
            is_words=engine.whole_words,
        )
        asked = 0
        while not found.done:
            queries = found.queries()
            assert all(q.read_by_server and q.answer_positions == (position + found.round,) for q in queries)
            asked += len(queries)
            found.advance(engine.predict(queries))
        assert 3 <= asked <= rows_bound(3, beam)
        assert found.round <= 3 and len(found.words) == top_k
    assert rows_bound(3, 16) == 3 + 16 * 3


class Scripted:
    """A model of fixed probabilities: piece 1 then 2, and nothing else above a tenth."""

    def predict(self, queries: list[Query]) -> list[TextPredictions]:
        out: list[TextPredictions] = []
        for q in queries:
            table = {1: 0.6, 2: 0.3, 3: 0.1}
            picks = sorted(((s, t) for t, s in table.items() if t in (q.target_ids or ())), reverse=True)
            out.append([[{"score": s, "token": t, "token_str": "", "sequence": ""} for s, t in picks[: q.top_k]]])
        return out


def test_prefixes_below_the_kth_word_are_dropped_and_the_rest_kept_to_the_beam() -> None:
    found = MaskSearch(
        (0, 9, 0),
        1,
        9,
        top_k=1,
        max_pieces=3,
        beam=2,
        pieces=WordPieces(starts=(1, 2, 3), continues=(1, 2, 3)),
        is_words=lambda words: [True] * len(words),
    )
    assert len(found.queries()) == 3  # one row per length
    found.advance(Scripted().predict(found.queries()))
    # The best one-piece word scores 0.6; prefixes of 0.6 stay, those of 0.3 and 0.1 cannot beat it.
    assert found.words == [Word(0.6, (1,))]
    asked = found.queries()
    assert [q.input_ids for q in asked] == [(0, 1, 9, 0), (0, 1, 9, 9, 0)]
    found.advance(Scripted().predict(asked))
    assert found.words == [Word(0.6, (1,))] and found.done
