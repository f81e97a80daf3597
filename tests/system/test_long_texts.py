"""Texts longer than the model reads, through the real server: every answer equals an oracle's.

The oracle (below) implements the documented window rule on its own, from its statement: a
window per group of asked positions, centred on the group, moved inside the text, its edges
moved inwards to word boundaries. It then reads each window with transformers itself: the
fill-mask pipeline on the window's text (decoded from the window's ids, and checked to tokenize
back to them), or the masked LM directly for ``/score`` and for whole words. The tiny models read
128 tokens; each long text is about three times that.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from aiohttp import ClientResponse
from transformers import AutoModelForMaskedLM, AutoTokenizer

from maskserve.engine import FillMaskEngine
from maskserve.engine.pretrained import default_model_dir
from tests.conftest import ClientFactory, EngineOf
from tests.models import WORDS

# Absolute, in float32: log-probabilities (/score) on any backend; a prediction's probability on
# torch, which runs the pipeline's own kernels, and on the graph backends, whose fused kernels sum
# in another order.
TOLERANCE = 1e-4
SCORE_TOLERANCE = {"torch": 1e-5, "onnxruntime": 1e-4, "openvino": 1e-4}
# Relative: a whole word's probability is a product of small ones.
WORD_TOLERANCE = 1e-5
# How many tokens the tiny models read, and the special tokens their tokenizers put around a text
# ([CLS] ... [SEP], <s> ... </s>): the oracle's own figures, checked against each model below.
MODEL_LENGTH = 128
AROUND = (1, 1)
# About three model lengths.
LONG_TOKENS = 380
TOP_K = 3
# Sentences of the tiny vocabularies' words, without punctuation, so that any word can be masked.
SENTENCES = [
    "paris is the capital of france",
    "the quick brown fox jumps over the lazy dog",
    "london is a big city in england on a river",
    "a small cat sleeps in the old house at night",
    "the king and the queen walks to the green tree",
    "the government of the country writes a book on education and health",
    "the teacher reads the story of the company to the community",
    "a child eats fish with the father in the morning",
    "the president of the team sings for the people of the world",
    "information on the history of the city is in the office",
]
# The default model (maskserve[demo]'s BERT) reads 512 tokens; the defaults' documents are longer.
DEFAULT_LENGTH = 512
# Rows the oracle's own forward passes read at once: a long text's copies, a few at a time.
ORACLE_ROWS = 64


# -- the oracle: the window rule, stated once more ----------------------------------------------


@dataclass(frozen=True)
class OracleWindow:
    """A window: the text's tokens [start, end), and the first positions of the spans it answers."""

    start: int
    end: int
    asked: tuple[int, ...]

    def ids(self, input_ids: Sequence[int]) -> list[int]:
        before, after = AROUND
        return [*input_ids[:before], *input_ids[self.start : self.end], *input_ids[len(input_ids) - after :]]

    def local(self, position: int) -> int:
        assert self.start <= position < self.end
        return position - self.start + AROUND[0]


def oracle_windows(
    word_ids: Sequence[int | None], spans: Sequence[tuple[int, int]], length: int = MODEL_LENGTH
) -> list[OracleWindow]:
    """The windows that answer ``spans`` (first, last inclusive) of a text of ``word_ids``, for a
    model reading ``length`` tokens."""
    before, after = AROUND
    if len(word_ids) <= length:  # a text the model reads whole is one window: itself
        return [OracleWindow(before, len(word_ids) - after, tuple(sorted({span[0] for span in spans})))]
    width = length - before - after
    margin = width // 4
    reach = width - 2 * margin
    groups: list[list[tuple[int, int]]] = []
    for first, last in sorted(set(spans)):
        if groups and first - groups[-1][0][0] < reach and last - groups[-1][0][0] < width:
            groups[-1].append((first, last))
        else:
            groups.append([(first, last)])

    def inside_a_word(i: int) -> bool:
        return word_ids[i] is not None and word_ids[i - 1] == word_ids[i]

    placed = []
    for group in groups:
        first, last = group[0][0], max(span[1] for span in group)
        start = first - (width - (last - first + 1)) // 2
        start = max(before, min(start, len(word_ids) - after - width))
        end = min(start + width, len(word_ids) - after)
        while start < first and inside_a_word(start):
            start += 1
        while end > last + 1 and inside_a_word(end):
            end -= 1
        placed.append(OracleWindow(start, end, tuple(span[0] for span in group)))
    return placed


def window_of(windows: Sequence[OracleWindow], position: int) -> OracleWindow:
    (window,) = [w for w in windows if position in w.asked]
    return window


# -- transformers itself ------------------------------------------------------------------------


@functools.cache
def hf_model(folder: Path) -> tuple[Any, Any]:
    """The folder's tokenizer and masked LM in float32, straight from transformers."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return tokenizer, AutoModelForMaskedLM.from_pretrained(str(folder)).float().eval()


@functools.cache
def pipeline(folder: Path) -> Any:
    return transformers.pipeline("fill-mask", model=str(folder), tokenizer=str(folder), device="cpu")


def encode(folder: Path, text: str) -> tuple[list[int], list[int | None]]:
    tokenizer, _ = hf_model(folder)
    encoding = tokenizer(text)
    ids: list[int] = encoding["input_ids"]
    word_ids: list[int | None] = encoding.word_ids()
    # The oracle's figures: one special token before the text's own, one after.
    assert word_ids[0] is None and word_ids[-1] is None and None not in word_ids[1:-1]
    return ids, word_ids


def mask_positions(folder: Path, ids: Sequence[int]) -> list[int]:
    tokenizer, _ = hf_model(folder)
    return [i for i, token in enumerate(ids) if token == tokenizer.mask_token_id]


def window_text(folder: Path, window_ids: Sequence[int]) -> str:
    """The window's own ids (its special tokens left out) as text, which tokenizes back to the
    window exactly: the pipeline then reads what the server read."""
    tokenizer, _ = hf_model(folder)
    text: str = tokenizer.decode(list(window_ids[AROUND[0] : len(window_ids) - AROUND[1]]))
    assert tokenizer(text)["input_ids"] == list(window_ids), f"{text!r} does not tokenize back to its window"
    return text


def per_mask(answer: Any) -> list[list[dict[str, Any]]]:
    """The pipeline's (and the API's) one-mask answer is a flat list: one list per mask again."""
    return [answer] if answer and isinstance(answer[0], dict) else list(answer)


def filled(folder: Path, ids: Sequence[int], position: int, tokens: Sequence[int]) -> str:
    """The whole text with ``tokens`` in place of the mask at ``position``, decoded as the pipeline
    decodes a filled text (special tokens, other masks among them, kept when it has several masks)."""
    tokenizer, _ = hf_model(folder)
    masks = len(mask_positions(folder, ids))
    text: str = tokenizer.decode([*ids[:position], *tokens, *ids[position + 1 :]], skip_special_tokens=masks == 1)
    return text


def log_probs(folder: Path, rows: Sequence[Sequence[int]], positions: Sequence[int]) -> torch.Tensor:
    """Each row's log-softmax over the vocabulary at its position; rows of one length run together.
    The model's own encoder, then its own masked-LM head at the read positions only (the vocabulary's
    logits at every position of a long text's copies would take gigabytes)."""
    _, model = hf_model(folder)
    head = model.cls if hasattr(model, "cls") else model.lm_head
    out = torch.empty(len(rows), model.config.vocab_size)
    by_length: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        by_length.setdefault(len(row), []).append(index)
    with torch.no_grad():
        for same_length in by_length.values():
            for start in range(0, len(same_length), ORACLE_ROWS):
                indices = same_length[start : start + ORACLE_ROWS]
                hidden = model.base_model(input_ids=torch.tensor([rows[i] for i in indices])).last_hidden_state
                read = hidden[torch.arange(len(indices)), torch.tensor([positions[i] for i in indices])]
                out[indices] = head(read).log_softmax(dim=-1)
    return out


def oracle_fill_mask(
    folder: Path, text: str, top_k: int = TOP_K, length: int = MODEL_LENGTH
) -> tuple[int, list[list[dict[str, Any]]]]:
    """A long text's window count and each mask's predictions: the pipeline on the mask's window,
    each ``sequence`` the whole text with the token put in."""
    ids, word_ids = encode(folder, text)
    positions = mask_positions(folder, ids)
    windows = oracle_windows(word_ids, [(p, p) for p in positions], length)
    answer = []
    for position in positions:
        window = window_of(windows, position)
        window_ids = window.ids(ids)
        own = per_mask(pipeline(folder)(window_text(folder, window_ids), top_k=top_k))
        local = mask_positions(folder, window_ids).index(window.local(position))
        answer.append([{**p, "sequence": filled(folder, ids, position, [p["token"]])} for p in own[local]])
    return len(windows), answer


def oracle_pll(folder: Path, text: str, metric: str, length: int = MODEL_LENGTH) -> tuple[int, list[tuple[int, float]]]:
    """A long text's window count and each scored token's (id, log-probability) with it masked (and
    the rest of its word to its right, for within_word_l2r), each read in its own window."""
    tokenizer, _ = hf_model(folder)
    ids, word_ids = encode(folder, text)
    spans = []
    for position in range(1, len(ids) - 1):
        last = position
        while (
            metric == "within_word_l2r" and word_ids[last + 1] is not None and word_ids[last + 1] == word_ids[position]
        ):
            last += 1
        spans.append((position, last))
    windows = oracle_windows(word_ids, spans, length)
    rows, reads, tokens = [], [], []
    for position, last in spans:
        window = window_of(windows, position)
        row = window.ids(ids)
        first, stop = window.local(position), window.local(last)
        row[first : stop + 1] = [tokenizer.mask_token_id] * (stop + 1 - first)
        rows.append(row)
        reads.append(first)
        tokens.append(ids[position])
    scores = log_probs(folder, rows, reads)
    return len(windows), [(token, float(scores[i, token])) for i, token in enumerate(tokens)]


def oracle_word_score(folder: Path, text: str, position: int, word: Sequence[int]) -> tuple[OracleWindow, float]:
    """The word's window and its chain-rule score on the mask at ``position``: the window is cut for
    a model narrower by k - 1 (the copy puts k tokens where the mask was); copy i holds
    t_1..t_{i-1}, then k - i + 1 masks, and reads t_i at position + i. The text's other masks stay
    masked."""
    tokenizer, _ = hf_model(folder)
    ids, word_ids = encode(folder, text)
    k = len(word)
    spans = [(p, p) for p in mask_positions(folder, ids)]
    window = window_of(oracle_windows(word_ids, spans, MODEL_LENGTH - (k - 1)), position)
    row, local = window.ids(ids), window.local(position)
    copies = [[*row[:local], *word[:i], *[tokenizer.mask_token_id] * (k - i), *row[local + 1 :]] for i in range(k)]
    scores = log_probs(folder, copies, [local + i for i in range(k)])
    return window, math.exp(sum(float(scores[i, token]) for i, token in enumerate(word)))


# -- building texts -----------------------------------------------------------------------------


def words_of_length(folder: Path, tokens: int = LONG_TOKENS) -> list[str]:
    """Sentences' words, in order, until the text takes at least ``tokens`` tokens on this model."""
    tokenizer, _ = hf_model(folder)
    words: list[str] = []
    sentence = 0
    while len(ids := tokenizer(" ".join(words))["input_ids"]) < tokens:
        words += SENTENCES[sentence % len(SENTENCES)].split()
        sentence += 1
    assert set(words) <= set(WORDS) and tokenizer.unk_token_id not in ids
    return words


def masked(folder: Path, words: Sequence[str], at: Sequence[int]) -> str:
    """The words as a text, those at ``at`` (word indices) replaced by the model's mask token."""
    tokenizer, _ = hf_model(folder)
    return " ".join(tokenizer.mask_token if i in at else word for i, word in enumerate(words))


async def post_ok(response: ClientResponse) -> Any:
    assert response.status == 200, await response.text()
    return await response.json()


def assert_same_predictions(got: Any, expected: Sequence[Sequence[dict[str, Any]]], tolerance: float) -> None:
    got = per_mask(got)
    assert len(got) == len(expected)
    for mask, (mine, theirs) in enumerate(zip(got, expected)):
        assert [sorted(p) for p in mine] == [sorted(p) for p in theirs], f"mask {mask}"
        assert [(p["token"], p["token_str"], p["sequence"]) for p in mine] == [
            (p["token"], p["token_str"], p["sequence"]) for p in theirs
        ], f"mask {mask}"
        assert [p["score"] for p in mine] == pytest.approx([p["score"] for p in theirs], abs=tolerance), f"mask {mask}"


def tolerance(engine: FillMaskEngine) -> float:
    return SCORE_TOLERANCE[engine.backend]


def model(request: pytest.FixtureRequest, name: str) -> tuple[FillMaskEngine, Path]:
    """This session's torch engine of the tiny model ``name``, and its folder."""
    engine: FillMaskEngine = request.getfixturevalue(f"{name}_engine")
    folder: Path = request.getfixturevalue(f"{name}_dir")
    assert engine.max_tokens == MODEL_LENGTH  # the oracle's figure
    return engine, folder


# -- fill-mask: each mask answered by its window ------------------------------------------------


async def check_long_text_answered_by_windows(make_client: ClientFactory, engine: FillMaskEngine, folder: Path) -> None:
    assert engine.max_tokens == MODEL_LENGTH
    words = words_of_length(folder)
    text = masked(folder, words, [0, len(words) // 2, len(words) - 1])
    ids, _ = encode(folder, text)
    assert len(ids) >= 3 * MODEL_LENGTH - 10
    count, expected = oracle_fill_mask(folder, text)
    assert count == 3  # start, middle and end: three windows apart

    client = await make_client(engine=engine)
    response = await client.post("/", json={"inputs": text, "parameters": {"top_k": TOP_K}})
    assert_same_predictions(await post_ok(response), expected, tolerance(engine))
    assert response.headers["X-Text-Windows"] == str(count)


async def test_a_long_bert_text_answers_each_mask_as_the_pipeline_answers_its_window(
    make_client: ClientFactory, engine_of: EngineOf, bert_dir: Path
) -> None:
    await check_long_text_answered_by_windows(make_client, engine_of("bert"), bert_dir)


@pytest.mark.parametrize("name", ["roberta", "xlmr"])
async def test_a_long_bpe_or_sentencepiece_text_answers_each_mask_as_the_pipeline_answers_its_window(
    make_client: ClientFactory, request: pytest.FixtureRequest, name: str
) -> None:
    await check_long_text_answered_by_windows(make_client, *model(request, name))


async def test_masks_close_together_share_a_window_and_masks_past_the_models_length_are_answered(
    make_client: ClientFactory, bert_engine: FillMaskEngine, bert_dir: Path
) -> None:
    words = words_of_length(bert_dir)
    # Three masks within half a window, then one whose window holds the third as context only.
    text = masked(bert_dir, words, [150, 153, 200, 262])
    ids, word_ids = encode(bert_dir, text)
    positions = mask_positions(bert_dir, ids)
    assert min(positions) > MODEL_LENGTH
    windows = oracle_windows(word_ids, [(p, p) for p in positions])
    assert [w.asked for w in windows] == [tuple(positions[:3]), (positions[3],)]
    assert windows[1].start <= positions[2]
    count, expected = oracle_fill_mask(bert_dir, text)
    assert count == 2

    client = await make_client(engine=bert_engine)
    response = await client.post("/", json={"inputs": text, "parameters": {"top_k": TOP_K}})
    body = await post_ok(response)
    assert response.headers["X-Text-Windows"] == "2"  # fewer windows than masks
    assert [len(mask) for mask in body] == [TOP_K] * 4
    assert_same_predictions(body, expected, tolerance(bert_engine))


# -- /score: each token read in its window ------------------------------------------------------


@pytest.mark.parametrize("metric", ["original", "within_word_l2r"])
@pytest.mark.parametrize("name", ["bert", "roberta", "xlmr"])
async def test_score_of_a_long_text_equals_the_pseudo_log_likelihood_window_by_window(
    make_client: ClientFactory, request: pytest.FixtureRequest, name: str, metric: str
) -> None:
    engine, folder = model(request, name)
    tokenizer, _ = hf_model(folder)
    text = " ".join(words_of_length(folder))
    count, expected = oracle_pll(folder, text, metric)
    assert count >= 5 and len(expected) > 2 * MODEL_LENGTH

    client = await make_client(engine=engine)
    response = await client.post("/score", json={"inputs": text, "parameters": {"metric": metric, "tokens": True}})
    body = await post_ok(response)
    assert body["windows"] == count
    assert response.headers["X-Text-Windows"] == str(count)
    assert [(t["token"], t["token_str"]) for t in body["tokens"]] == [
        (token, tokenizer.decode([token])) for token, _ in expected
    ]
    assert [t["score"] for t in body["tokens"]] == pytest.approx([score for _, score in expected], abs=TOLERANCE)
    assert body["score"] == pytest.approx(math.fsum(score for _, score in expected), abs=TOLERANCE)


# -- long documents on the defaults ------------------------------------------------------------


@pytest.fixture(scope="module")
def default_dir() -> Path:
    folder = default_model_dir()
    assert folder is not None, "maskserve[demo] is not installed"
    return folder


async def test_on_the_defaults_a_1000_token_text_is_scored_window_by_window(
    make_client: ClientFactory, default_engine: FillMaskEngine, default_dir: Path
) -> None:
    assert default_engine.max_tokens == DEFAULT_LENGTH
    text = " ".join(words_of_length(default_dir, 1000))
    count, expected = oracle_pll(default_dir, text, "original", DEFAULT_LENGTH)
    assert len(expected) >= 998 and count >= 3

    client = await make_client(engine=default_engine)  # every limit at its default
    response = await client.post("/score", json={"inputs": text, "parameters": {"tokens": True}})
    body = await post_ok(response)
    assert body["windows"] == count and response.headers["X-Text-Windows"] == str(count)
    assert [t["token"] for t in body["tokens"]] == [token for token, _ in expected]
    assert [t["score"] for t in body["tokens"]] == pytest.approx([score for _, score in expected], abs=TOLERANCE)


async def test_on_the_defaults_a_1500_token_document_with_20_masks_answers_each_as_its_window(
    make_client: ClientFactory, default_engine: FillMaskEngine, default_dir: Path
) -> None:
    words = words_of_length(default_dir, 1500)
    text = masked(default_dir, words, [1 + i * (len(words) - 2) // 19 for i in range(20)])
    ids, _ = encode(default_dir, text)
    assert len(ids) >= 1500 and len(mask_positions(default_dir, ids)) == 20
    count, expected = oracle_fill_mask(default_dir, text, TOP_K, DEFAULT_LENGTH)

    client = await make_client(engine=default_engine)  # every limit at its default
    response = await client.post("/", json={"inputs": text, "parameters": {"top_k": TOP_K}})
    assert_same_predictions(await post_ok(response), expected, TOLERANCE)
    assert response.headers["X-Text-Windows"] == str(count)
    # Eight masks for each 512 tokens the model reads: a text of 1,500 tokens holds 24, not 25.
    crowded = masked(default_dir, words, [1 + i * (len(words) - 2) // 24 for i in range(25)])
    too_many = await client.post("/", json={"inputs": crowded})
    assert too_many.status == 422
    error = await too_many.json()
    assert error["error_type"] == "too_many_masks" and "the limit is 24 for a text of" in error["error"]
    assert "--max-masks-per-text" in error["error"]


# -- whole words past the model's length --------------------------------------------------------

# On the tiny WordPiece BERT: "dog" is one token; "cats" two (cat ##s), "parisians" three (paris ##ian ##s).
WORD_TARGETS = ["dog", "cats", "parisians"]


def oracle_with_words(
    folder: Path, text: str, targets: Sequence[str]
) -> tuple[set[tuple[int, int]], list[list[dict[str, Any]]]]:
    """The windows a text with whole-word targets is read in (its own, for its single-token targets,
    and its copies'), and each mask's candidates by score: single tokens as the pipeline answers
    them in the mask's window, whole words by the chain rule on their narrower windows."""
    tokenizer, _ = hf_model(folder)
    ids, word_ids = encode(folder, text)
    positions = mask_positions(folder, ids)
    words = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in targets]
    single = [name for name, word in zip(targets, words) if len(word) == 1]
    own = oracle_windows(word_ids, [(p, p) for p in positions])
    read = {(w.start, w.end) for w in own} if single else set()
    expected: list[list[dict[str, Any]]] = []
    for position in positions:
        candidates = []
        if single:
            window = window_of(own, position)
            answer = per_mask(pipeline(folder)(window_text(folder, window.ids(ids)), targets=single, top_k=len(single)))
            local = mask_positions(folder, window.ids(ids)).index(window.local(position))
            candidates += [{**p, "sequence": filled(folder, ids, position, [p["token"]])} for p in answer[local]]
        for word in words:
            if len(word) == 1:
                continue
            narrow, score = oracle_word_score(folder, text, position, word)
            read.add((narrow.start, narrow.end))
            candidates.append(
                {
                    "score": score,
                    "token": word[0],
                    "token_str": tokenizer.decode(word),
                    "sequence": filled(folder, ids, position, word),
                    "tokens": word,
                }
            )
        expected.append(sorted(candidates, key=lambda p: -p["score"]))
    return read, expected


def assert_same_with_words(got: Any, expected: Sequence[Sequence[dict[str, Any]]]) -> None:
    got = per_mask(got)
    assert len(got) == len(expected)
    for mask, (mine, theirs) in enumerate(zip(got, expected)):
        assert [sorted(p) for p in mine] == [sorted(p) for p in theirs], f"mask {mask}"
        assert [(p["token"], p["token_str"], p["sequence"], p.get("tokens")) for p in mine] == [
            (p["token"], p["token_str"], p["sequence"], p.get("tokens")) for p in theirs
        ], f"mask {mask}"
        scores = pytest.approx([p["score"] for p in theirs], rel=WORD_TOLERANCE)
        assert [p["score"] for p in mine] == scores, f"mask {mask}"


async def test_a_whole_word_past_the_models_length_is_the_chain_rule_on_its_narrower_window(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine, wordpiece_dir: Path
) -> None:
    words = words_of_length(wordpiece_dir)
    text = masked(wordpiece_dir, words, [3, len(words) // 2])
    assert mask_positions(wordpiece_dir, encode(wordpiece_dir, text)[0])[1] > MODEL_LENGTH
    read, expected = oracle_with_words(wordpiece_dir, text, WORD_TARGETS)
    assert [len(mask) for mask in expected] == [3, 3]

    client = await make_client(engine=wordpiece_engine)
    response = await client.post("/", json={"inputs": text, "parameters": {"targets": WORD_TARGETS, "top_k": 3}})
    assert_same_with_words(await post_ok(response), expected)
    # Per mask: its own window (for "dog"), and one per length of word (each narrower).
    assert response.headers["X-Text-Windows"] == str(len(read)) == "6"


async def test_a_text_that_fits_but_not_with_a_whole_word_in_reads_its_copies_in_windows(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine, wordpiece_dir: Path
) -> None:
    text = masked(wordpiece_dir, words_of_length(wordpiece_dir, MODEL_LENGTH)[: MODEL_LENGTH - 2], [60])
    assert len(encode(wordpiece_dir, text)[0]) == MODEL_LENGTH
    _, expected = oracle_with_words(wordpiece_dir, text, WORD_TARGETS)
    client = await make_client(engine=wordpiece_engine)
    response = await client.post("/", json={"inputs": text, "parameters": {"targets": WORD_TARGETS, "top_k": 3}})
    assert_same_with_words(await post_ok(response), expected)


async def test_whole_words_alone_count_only_the_windows_their_copies_read(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine, wordpiece_dir: Path
) -> None:
    # No single-token target: the text's own windows are never queued, so they are not windows it
    # was read in; the header counts the copies' windows alone.
    words = words_of_length(wordpiece_dir)
    text = masked(wordpiece_dir, words, [len(words) // 2])
    read, expected = oracle_with_words(wordpiece_dir, text, ["cats"])
    assert len(read) == 1
    client = await make_client(engine=wordpiece_engine)
    response = await client.post("/", json={"inputs": text, "parameters": {"targets": ["cats"]}})
    assert_same_with_words(await post_ok(response), expected)
    assert response.headers["X-Text-Windows"] == "1"


# -- texts that fit, and the limits -------------------------------------------------------------


async def test_a_text_that_fits_is_answered_exactly_as_the_pipeline_answers_it(
    make_client: ClientFactory, engine_of: EngineOf, bert_dir: Path
) -> None:
    engine = engine_of("bert")
    fitting = masked(bert_dir, words_of_length(bert_dir, MODEL_LENGTH)[: MODEL_LENGTH - 2], [0, MODEL_LENGTH - 3])
    assert len(encode(bert_dir, fitting)[0]) == MODEL_LENGTH  # the longest text read whole
    client = await make_client(engine=engine)
    for text in ["paris is the [MASK] of france.", "the [MASK] is the [MASK] of france.", fitting]:
        response = await client.post("/", json={"inputs": text, "parameters": {"top_k": TOP_K}})
        expected = per_mask(pipeline(bert_dir)(text, top_k=TOP_K))
        assert_same_predictions(await post_ok(response), expected, tolerance(engine))
        assert response.headers["X-Text-Windows"] == "1"
    # One token longer is read in windows.
    longer = fitting.replace("[MASK]", "[MASK] the", 1)
    assert len(encode(bert_dir, longer)[0]) == MODEL_LENGTH + 1
    response = await client.post("/", json={"inputs": longer, "parameters": {"top_k": TOP_K}})
    count, expected = oracle_fill_mask(bert_dir, longer)
    assert_same_predictions(await post_ok(response), expected, tolerance(engine))
    assert response.headers["X-Text-Windows"] == str(count)


async def test_score_of_a_text_that_fits_is_read_whole(
    make_client: ClientFactory, bert_engine: FillMaskEngine, bert_dir: Path
) -> None:
    text = "the quick brown fox jumps over the lazy dog"
    count, expected = oracle_pll(bert_dir, text, "original")
    client = await make_client(engine=bert_engine)
    response = await client.post("/score", json={"inputs": text, "parameters": {"tokens": True}})
    body = await post_ok(response)
    assert count == 1 and body["windows"] == 1 and response.headers["X-Text-Windows"] == "1"
    assert [t["score"] for t in body["tokens"]] == pytest.approx([score for _, score in expected], abs=TOLERANCE)


async def error_of(response: ClientResponse) -> dict[str, Any]:
    assert response.status == 422, await response.text()
    body: dict[str, Any] = await response.json()
    return body


def long_input(folder: Path, route: str, words: Sequence[str]) -> str:
    """The words as a text to send to ``route``: masked at both ends for fill-mask, plain to score."""
    return masked(folder, words, [0, len(words) - 1]) if route == "/" else " ".join(words)


def oracle_count(folder: Path, route: str, text: str) -> str:
    """How many windows the oracle reads ``text`` in: around its masks, or around every token it scores."""
    ids, word_ids = encode(folder, text)
    asked = mask_positions(folder, ids) if route == "/" else range(1, len(ids) - 1)
    return str(len(oracle_windows(word_ids, [(p, p) for p in asked])))


@pytest.mark.parametrize("route", ["/", "/score"])
async def test_a_text_over_max_text_tokens_is_422_naming_both_numbers(
    make_client: ClientFactory, bert_dir: Path, route: str
) -> None:
    words = words_of_length(bert_dir)
    text = long_input(bert_dir, route, words)
    tokens = len(encode(bert_dir, text)[0])
    # The characters' limit would follow the tokens' down to 1,600 and meet this text first.
    client = await make_client(max_text_tokens=200, max_text_chars=32_768)
    error = await error_of(await client.post(route, json={"inputs": text}))
    assert error["error_type"] == "text_too_long"
    assert f"{tokens} tokens" in error["error"] and "the limit is 200" in error["error"]
    assert error["field"] == "inputs"
    # At the limit, a text longer than the model reads is read in windows.
    under = long_input(bert_dir, route, words[:198])
    assert len(encode(bert_dir, under)[0]) == 200
    response = await client.post(route, json={"inputs": under})
    await post_ok(response)
    assert response.headers["X-Text-Windows"] == oracle_count(bert_dir, route, under) != "1"


@pytest.mark.parametrize("route", ["/", "/score"])
async def test_long_text_refuse_is_422_naming_both_numbers_and_the_server_serves_on(
    make_client: ClientFactory, bert_dir: Path, route: str
) -> None:
    text = long_input(bert_dir, route, words_of_length(bert_dir))
    tokens = len(encode(bert_dir, text)[0])
    client = await make_client()
    error = await error_of(await client.post(route, json={"inputs": text, "parameters": {"long_text": "refuse"}}))
    assert error["error_type"] == "text_too_long"
    assert f"{tokens} tokens" in error["error"] and f"at most {MODEL_LENGTH}" in error["error"]
    assert "parameters.long_text" in error["error"]
    # A text that fits is answered, refuse or not; the long one is answered in windows when asked.
    short = long_input(bert_dir, route, SENTENCES[0].split())
    response = await client.post(route, json={"inputs": short, "parameters": {"long_text": "refuse"}})
    await post_ok(response)
    assert response.headers["X-Text-Windows"] == "1"
    response = await client.post(route, json={"inputs": text, "parameters": {"long_text": "window"}})
    await post_ok(response)
    assert response.headers["X-Text-Windows"] == oracle_count(bert_dir, route, text) != "1"


@pytest.mark.parametrize("route", ["/", "/score"])
@pytest.mark.parametrize("value", ["truncate", "", 1, True, ["window"]])
async def test_a_bad_long_text_is_422_naming_it(make_client: ClientFactory, route: str, value: Any) -> None:
    client = await make_client()
    text = "paris is the [MASK] of france."
    error = await error_of(await client.post(route, json={"inputs": text, "parameters": {"long_text": value}}))
    assert error["error_type"] == "invalid_input"
    assert "parameters.long_text must be one of window, refuse" in error["error"]
    assert error["field"] == "parameters.long_text"
    await post_ok(await client.post(route, json={"inputs": text}))


# -- several texts: each its own count ----------------------------------------------------------


async def test_the_header_lists_each_texts_windows_in_order(
    make_client: ClientFactory, bert_engine: FillMaskEngine, bert_dir: Path
) -> None:
    words = words_of_length(bert_dir)
    long = masked(bert_dir, words, [0, len(words) // 2, len(words) - 1])
    short = "paris is the [MASK] of france."
    count, expected = oracle_fill_mask(bert_dir, long)
    assert count == 3
    client = await make_client(engine=bert_engine)

    response = await client.post("/", json={"inputs": [long, short], "parameters": {"top_k": TOP_K}})
    body = await post_ok(response)
    assert response.headers["X-Text-Windows"] == "3, 1"
    assert_same_predictions(body[0], expected, tolerance(bert_engine))
    assert_same_predictions(body[1], per_mask(pipeline(bert_dir)(short, top_k=TOP_K)), tolerance(bert_engine))
    response = await client.post("/", json={"inputs": [short, long], "parameters": {"top_k": TOP_K}})
    await post_ok(response)
    assert response.headers["X-Text-Windows"] == "1, 3"

    plain = " ".join(words)
    windows, _ = oracle_pll(bert_dir, plain, "original")
    response = await client.post("/score", json={"inputs": [short, plain]})
    body = await post_ok(response)
    assert response.headers["X-Text-Windows"] == f"1, {windows}"
    assert [text["windows"] for text in body] == [1, windows]
