"""The whole-word search, held to a brute-force oracle on a tiny model of each tokenizer family.

The oracle scores sequences of up to three non-special pieces at a mask by the chain rule, with
the Hugging Face model itself (the mask replaced by n masks; piece i read with pieces 1..i-1 in
place, a softmax over the whole vocabulary), then walks them from the most probable down, keeping
those the tokenizer writes so as one word, until it has top_k. Every one- and two-piece sequence
is scored; a three-piece word's third piece is read only under the two-piece prefixes whose
probability reaches the k-th word found so far. That is exact, not a beam: a prefix's probability
bounds every completion of it (each further factor is at most 1), so a prefix below the k-th word
holds no word of the top k. The oracle shares no code with the search. The search, with a beam
wide enough to hold every prefix, must return exactly the oracle's words and scores.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from maskserve.engine import FillMaskEngine, load_engine
from maskserve.model_api import Query, TextPredictions, WordPieces
from maskserve.tasks.whole_words import word_copies
from maskserve.tasks.word_search import DEFAULT_WORD_BEAM, MaskSearch, Word, rows_bound

# Relative, on products of float32 probabilities: the engine reads the last layer at the asked
# rows only, the oracle runs the whole model. Relative, as a three-piece word's score is small.
RELATIVE = 1e-4
FAMILIES = ("wordpiece", "roberta", "xlmr")
# Wider than every prefix of the tiny models' words: nothing is cut but by the bound.
WIDE = 10**6
# The oracle reads third pieces for this many prefixes at a time, checking the bound between.
PREFIX_CHUNK = 64


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


class Oracle:
    """The chain rule at one mask of one text: every word of one and two pieces scored, the third
    piece of a three-piece word read on demand (per two-piece prefix, kept once read)."""

    def __init__(self, folder: Path, ids: tuple[int, ...], position: int, mask_id: int) -> None:
        tokenizer, self.model = hf(folder)
        self.before, self.after, self.mask_id = list(ids[:position]), list(ids[position + 1 :]), mask_id
        self.position = position
        size = self.model.config.vocab_size
        # No special token anywhere in a word: its factor is 0.
        self.allowed = torch.ones(size)
        self.allowed[tokenizer.all_special_ids] = 0.0
        none = torch.zeros((1, 0), dtype=torch.long)
        ones = torch.arange(size)[:, None]
        self.one = self.read(none, 1, 0)[0] * self.allowed
        self.two = self.read(none, 2, 0)[0][:, None] * self.read(ones, 1, 1) * self.allowed * self.allowed[:, None]
        # P(first two pieces of a three-piece word): bounds each of its completions.
        self.prefix3 = self.read(none, 3, 0)[0][:, None] * self.read(ones, 2, 1) * self.allowed * self.allowed[:, None]
        self.thirds: dict[tuple[int, int], torch.Tensor] = {}

    def read(self, prefixes: torch.Tensor, masks: int, at: int) -> torch.Tensor:
        rows = filled(self.before, self.after, prefixes, masks, self.mask_id)
        return probabilities(self.model, rows, self.position + at)

    def third(self, prefixes: list[tuple[int, int]]) -> torch.Tensor:
        """The three-piece words under each prefix, scored: one row per prefix."""
        new = [p for p in prefixes if p not in self.thirds]
        if new:
            for p, row in zip(new, self.read(torch.tensor(new), 1, 2)):
                self.thirds[p] = row * self.allowed
        return torch.stack([self.prefix3[p] * self.thirds[p] for p in prefixes])

    def score(self, word: tuple[int, ...]) -> float:
        if len(word) == 3:
            return float(self.third([word[:2]])[0][word[2]])
        return float((self.one, self.two)[len(word) - 1][word])

    def top(self, top_k: int, is_words: Any) -> list[Word]:
        """The ``top_k`` most probable whole words of 1..3 pieces."""
        flat = torch.cat([self.one, self.two.flatten()])
        best = walk(flat, [(i,) for i in range(len(self.one))], top_k, is_words, self.two.shape[1])
        floor = best[-1].score if len(best) == top_k else 0.0
        bounds, order = self.prefix3.flatten().sort(descending=True)
        size = self.prefix3.shape[1]
        for start in range(0, len(order), PREFIX_CHUNK):
            if float(bounds[start]) < floor or float(bounds[start]) == 0.0:
                break  # this prefix and every later one bound their words below the k-th
            chunk = [divmod(int(i), size) for i in order[start : start + PREFIX_CHUNK]]
            words = self.third(chunk)
            found = walk(words.flatten(), [], top_k, is_words, size, prefixes=chunk, floor=floor)
            best = sorted(best + found, key=lambda w: w.score, reverse=True)[:top_k]
            floor = best[-1].score if len(best) == top_k else 0.0
        assert len(best) == top_k, "fewer whole words than top_k"
        return best


def walk(
    flat: torch.Tensor,
    ones: list[tuple[int, ...]],
    top_k: int,
    is_words: Any,
    size: int,
    *,
    prefixes: list[tuple[int, int]] | None = None,
    floor: float = 0.0,
) -> list[Word]:
    """The best ``top_k`` whole words of ``flat``, from the most probable down: the first
    ``len(ones)`` entries are those one-piece words, the rest a grid of rows (a first piece, or a
    two-piece prefix of ``prefixes``) by ``size`` last pieces. Entries at or below ``floor``
    cannot enter the answer and are not walked."""
    values, indices = flat.sort(descending=True)
    found: list[Word] = []
    for start in range(0, len(values), 512):
        chunk = [(float(v), int(i)) for v, i in zip(values[start : start + 512], indices[start : start + 512])]
        chunk = [(v, i) for v, i in chunk if v > floor]
        words: list[Word] = []
        for value, index in chunk:
            if index < len(ones):
                words.append(Word(value, ones[index]))
            else:
                row, last = divmod(index - len(ones), size)
                words.append(Word(value, (*prefixes[row], last) if prefixes is not None else (row, last)))
        found.extend(w for w, ok in zip(words, is_words([w.pieces for w in words])) if ok)
        if len(found) >= top_k or len(chunk) < 512:
            break
    return found[:top_k]


@functools.cache
def oracle_at(folder: Path, ids: tuple[int, ...], position: int, mask_id: int) -> Oracle:
    return Oracle(folder, ids, position, mask_id)


def mask_at(engine: FillMaskEngine, text: str, mask: int) -> tuple[tuple[int, ...], int]:
    ids = engine.encode(text)
    return ids, [i for i, t in enumerate(ids) if t == engine.mask_token_id][mask]


def oracle_for(folder: Path, engine: FillMaskEngine, text: str, mask: int = 0) -> Oracle:
    ids, position = mask_at(engine, text, mask)
    return oracle_at(folder, tuple(ids), position, engine.mask_token_id)


def oracle(folder: Path, engine: FillMaskEngine, text: str, top_k: int, mask: int = 0) -> list[Word]:
    return oracle_for(folder, engine, text, mask).top(top_k, engine.whole_words)


def assert_same_words(got: list[Word], expected: list[Word]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.score == pytest.approx(e.score, rel=RELATIVE)
    # The same words; two whose scores tie within the tolerance may come in either order.
    assert {w.pieces for w in got} == {w.pieces for w in expected} or all(
        g.score == pytest.approx(e.score, rel=RELATIVE) for g, e in zip(got, expected) if g.pieces != e.pieces
    )


# Words whose pieces the boosted models favour (each family keeps those it splits into three).
BOOSTED_WORDS = ("catings", "kingers", "fishings", "doggers", "dogcat", "greencat", "redcat")
# Past every one- and two-piece word of the boosted pieces, so that three-piece words rank in.
MANY = 60


def boosted(folder: Path, into: Path) -> Path:
    """The family's tiny model with the pieces of a few three-piece words made likely at every
    position (their output bias raised), so that words of three pieces reach the top few: with
    random weights alone they rank below thousands of shorter ones."""
    tokenizer, model = AutoTokenizer.from_pretrained(str(folder)), AutoModelForMaskedLM.from_pretrained(str(folder))
    split = [tokenizer(" " + w, add_special_tokens=False)["input_ids"] for w in BOOSTED_WORDS]
    ids = sorted({piece for pieces in split if len(pieces) == 3 for piece in pieces})
    assert ids, "no three-piece word to boost"
    with torch.no_grad():
        model.get_output_embeddings().bias[ids] += 6.0
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)
    return into


@pytest.fixture(scope="module", params=FAMILIES)
def boosted_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, FillMaskEngine]:
    family = request.param
    folder = boosted(request.getfixturevalue(f"{family}_dir"), tmp_path_factory.mktemp(f"boosted-{family}"))
    return folder, load_engine(str(folder), threads=1)


def test_a_wide_beam_finds_exactly_the_oracles_top_words(boosted_model: tuple[Path, FillMaskEngine]) -> None:
    folder, engine = boosted_model
    text = f"the {engine.mask_token} sat on the house ."
    expected = oracle(folder, engine, text, MANY)
    assert {len(w.pieces) for w in expected} == {1, 2, 3}, "the answer holds words of every length"
    assert_same_words(search(engine, text, top_k=MANY, beam=WIDE), expected)


def test_the_default_beam_scores_every_word_it_returns_exactly(boosted_model: tuple[Path, FillMaskEngine]) -> None:
    folder, engine = boosted_model
    text = f"the {engine.mask_token} sat on the house ."
    got = search(engine, text, top_k=MANY, beam=DEFAULT_WORD_BEAM)
    assert {len(w.pieces) for w in got} == {1, 2, 3}
    for word in got:
        assert word.score == pytest.approx(oracle_for(folder, engine, text).score(word.pieces), rel=RELATIVE)
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


def test_a_words_score_equals_its_targets_score_and_a_one_piece_words_the_plain_fills(
    boosted_model: tuple[Path, FillMaskEngine],
) -> None:
    _, engine = boosted_model
    text = f"the {engine.mask_token} sat on the house ."
    ids, position = mask_at(engine, text, 0)
    got = search(engine, text, top_k=MANY, beam=DEFAULT_WORD_BEAM)
    assert {len(w.pieces) for w in got} == {1, 2, 3}
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


FLAT = (0.19, 0.18, 0.17, 0.16, 0.15, 0.14, 0.13, 0.12, 0.11, 0.10)


def test_words_are_checked_best_first_only_while_one_could_enter_and_the_answer_is_unchanged() -> None:
    checked: list[tuple[int, ...]] = []

    def odd_words(words: Sequence[tuple[int, ...]]) -> list[bool]:
        """Only words whose pieces sum to an odd number are whole words; every check recorded."""
        checked.extend(words)
        return [sum(word) % 2 == 1 for word in words]

    class Flat:
        """Ten candidates a row, of falling probability: 0.19, 0.18, ... 0.10."""

        def predict(self, queries: list[Query]) -> list[TextPredictions]:
            return [
                [[{"score": FLAT[t - 1], "token": t, "token_str": "", "sequence": ""} for t in range(1, 11)]]
                for _ in queries
            ]

    found = MaskSearch(
        (0, 99, 0),
        1,
        99,
        top_k=2,
        max_pieces=1,
        beam=10,
        pieces=WordPieces(starts=tuple(range(1, 11)), continues=()),
        is_words=odd_words,
    )
    found.advance(Flat().predict(found.queries()))
    # The two best whole words: 1 (0.19) and 3 (0.17). Checked two at a time, best first, the
    # checks stop once no candidate left could beat the second: 4 of the 10.
    assert found.words == [Word(0.19, (1,)), Word(0.17, (3,))]
    assert checked == [(1,), (2,), (3,), (4,)]
