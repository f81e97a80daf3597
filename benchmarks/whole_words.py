"""Whole words against plain fills on the default model, in one run: cost, and what they find.

    flock /tmp/bench.lock python -m benchmarks.whole_words           # the full run: about a minute on 2 cores
    flock /tmp/bench.lock python -m benchmarks.whole_words --quick   # tiny counts, for the test

The texts are benchmarks/cloze_words.py's sentences whose answer the model's tokenizer splits into
2 or 3 pieces (a word a plain fill can never offer), one mask each. One server (maskserve on its
defaults but :data:`SERVE_FLAGS`) answers everything over HTTP.

**Cost.** A plain fill (``top_k`` 5) against a whole-word fill (``whole_words``, ``max_word_pieces``
3, the default beam, ``top_k`` 5) of the same sentences: at c=1 each request's wall time, the two
kinds interleaved request by request, p50 of each; at c=8 closed-loop clients, sentences/s of each
kind in turn, twice (plain, words, plain, words), the ratio taken within each pair.

**Search.** Per sentence, the default beam's top 5 against the widest beam the server allows
(``word_beam`` :data:`WIDE_BEAM`): the same words in the same order, or not.

**Accuracy.** Per sentence, the answer's rank among the whole words (``top_k`` :data:`RANK_K`,
the default beam), among the plain fill's answers (``top_k`` :data:`RANK_K`), which hold single
pieces only and so never the answer, and under X-FACTR's independent decoding given the right
length: the mask written as as many masks as the answer has pieces, one pass, each mask read on
its own, piece sequences ranked by the product of their masks' probabilities (each piece from its
mask's top :data:`RANK_K`). ``--model PATH`` runs it all on another model (a trained one is what
makes the ranks mean something; the default model is small).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import torch
import transformers
from transformers import AutoTokenizer

import maskserve
from maskserve.tasks.word_search import DEFAULT_WORD_BEAM, MAX_WORD_BEAM

from .agreement import cpu_line
from .cloze_words import CLOZE
from .load import percentile
from .models import default_model
from .run import cpu_model, load_averages, log, publish
from .servers import Server, free_port, maskserve_argv

RESULTS = Path(__file__).resolve().parent / "results" / "whole-words.md"
TOP_K = 5
PIECES = 3
WIDE_BEAM = MAX_WORD_BEAM
# How deep the answer's rank is looked for, in both pipelines.
RANK_K = 100
CONCURRENCY = 8
# A wide beam's rows (rows_bound(3, 1024) = 3075) fit the default queue; time for one on a slow machine.
SERVE_FLAGS = ("--request-timeout", "300")
# The targets (ratios in one run): c=1 p50 of words at most this times plain's; c=8 throughput at
# least this times plain's; the default beam's top 5 the wide beam's on at least this share.
TARGET_LATENCY = 4.0
TARGET_THROUGHPUT = 0.3
TARGET_EXACT = 0.95


@dataclass(frozen=True)
class Plan:
    latency_rounds: int  # each sentence once per kind per round, at c=1
    throughput_requests: int  # per kind and pair, at c=8
    pairs: int
    sentences: int  # of the cloze set (the first ones)


FULL = Plan(latency_rounds=2, throughput_requests=400, pairs=2, sentences=1000)
QUICK = Plan(latency_rounds=1, throughput_requests=16, pairs=1, sentences=6)


@dataclass(frozen=True)
class Cloze:
    text: str
    answer: str
    pieces: tuple[int, ...]
    mask: str


@dataclass
class Result:
    clozes: list[Cloze]
    latency_ms: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "words": []})
    throughput: list[tuple[float, float]] = field(default_factory=list)  # (plain, words) sentences/s
    exact: list[bool] = field(default_factory=list)
    word_ranks: list[int | None] = field(default_factory=list)
    plain_ranks: list[int | None] = field(default_factory=list)
    independent_ranks: list[int | None] = field(default_factory=list)
    model: str = ""
    averages: tuple[float, float, float] = (0.0, 0.0, 0.0)


def clozes(tokenizer: Any, limit: int) -> list[Cloze]:
    """The cloze set's sentences whose answer takes 2 or 3 pieces of ``tokenizer``."""
    found = []
    for sentence, answer in CLOZE:
        pieces = tuple(tokenizer(answer, add_special_tokens=False)["input_ids"])
        if 2 <= len(pieces) <= PIECES:
            found.append(Cloze(sentence.format(mask=tokenizer.mask_token), answer, pieces, tokenizer.mask_token))
    return found[:limit]


# The beam the whole-word fills use (--beam; the server's default unless told).
BEAM = {"width": DEFAULT_WORD_BEAM}


def parameters(kind: str, top_k: int = TOP_K, beam: int | None = None) -> dict[str, Any]:
    if kind == "plain":
        return {"top_k": top_k}
    return {"top_k": top_k, "whole_words": True, "max_word_pieces": PIECES, "word_beam": beam or BEAM["width"]}


async def fill(session: aiohttp.ClientSession, url: str, text: str, asked: dict[str, Any]) -> list[dict[str, Any]]:
    async with session.post(url, json={"inputs": text, "parameters": asked}) as response:
        body = await response.text()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {body[:200]}")
    answer: list[dict[str, Any]] = json.loads(body)
    return answer


async def latency(session: aiohttp.ClientSession, url: str, plan: Plan, result: Result) -> None:
    """c=1, the two kinds interleaved request by request, so that drift weighs on both alike."""
    for _, cloze in itertools.product(range(plan.latency_rounds), result.clozes):
        for kind in ("plain", "words"):
            started = time.perf_counter()
            await fill(session, url, cloze.text, parameters(kind))
            result.latency_ms[kind].append((time.perf_counter() - started) * 1000)


async def throughput(url: str, kind: str, texts: Sequence[str], requests: int) -> float:
    """Sentences/s of ``kind`` from :data:`CONCURRENCY` closed-loop clients."""
    counter = itertools.count()

    async def client(session: aiohttp.ClientSession) -> None:
        while (i := next(counter)) < requests:
            await fill(session, url, texts[i % len(texts)], parameters(kind))

    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(CONCURRENCY)))
        return requests / (time.perf_counter() - started)


def rank(answer: Sequence[dict[str, Any]], pieces: tuple[int, ...]) -> int | None:
    """The 1-based rank of the word of ``pieces`` in an answer (a plain one lists ``token`` only)."""
    for index, prediction in enumerate(answer, start=1):
        if tuple(prediction.get("tokens") or (prediction["token"],)) == pieces:
            return index
    return None


async def search_and_accuracy(session: aiohttp.ClientSession, url: str, result: Result) -> None:
    for cloze in result.clozes:
        default = await fill(session, url, cloze.text, parameters("words"))
        wide = await fill(session, url, cloze.text, parameters("words", beam=WIDE_BEAM))
        result.exact.append([p["tokens"] for p in default] == [p["tokens"] for p in wide])
        deep = await fill(session, url, cloze.text, parameters("words", top_k=RANK_K))
        result.word_ranks.append(rank(deep, cloze.pieces))
        plain = await fill(session, url, cloze.text, parameters("plain", top_k=RANK_K))
        result.plain_ranks.append(rank(plain, cloze.pieces))
        result.independent_ranks.append(await independent_rank(session, url, cloze))


async def independent_rank(session: aiohttp.ClientSession, url: str, cloze: Cloze) -> int | None:
    """The answer's rank under X-FACTR's independent decoding given its length (see the module's
    docstring), or None past :data:`RANK_K` or when a piece is not among its mask's top ones."""
    masks = cloze.text.replace(cloze.mask, cloze.mask * len(cloze.pieces))
    answer = await fill(session, url, masks, parameters("plain", top_k=RANK_K))
    return product_rank([{p["token"]: p["score"] for p in mask} for mask in answer], cloze.pieces)


def product_rank(per_mask: Sequence[dict[int, float]], pieces: tuple[int, ...]) -> int | None:
    """The rank of ``pieces`` among every sequence of one piece per mask (each mask's scores by
    piece), ranked by the product of their probabilities; None past :data:`RANK_K` or when a
    piece is not among its mask's."""
    if any(piece not in scores for piece, scores in zip(pieces, per_mask, strict=True)):
        return None
    wanted = float(np.prod([scores[piece] for piece, scores in zip(pieces, per_mask, strict=True)]))
    products = functools.reduce(np.multiply.outer, [np.fromiter(s.values(), dtype=np.float64) for s in per_mask])
    place = int((products > wanted).sum()) + 1
    return place if place <= RANK_K else None


async def measure(url: str, plan: Plan, result: Result) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        log("warm-up")
        for kind in ("plain", "words"):
            await fill(session, url, result.clozes[0].text, parameters(kind))
        log(f"c=1: {len(result.clozes)} sentences x {plan.latency_rounds} rounds, both kinds")
        await latency(session, url, plan, result)
        log("the default beam against the wide one, and the answers' ranks")
        await search_and_accuracy(session, url, result)
    texts = [cloze.text for cloze in result.clozes]
    for pair in range(plan.pairs):
        log(f"c={CONCURRENCY}: pair {pair + 1} of {plan.pairs}")
        plain = await throughput(url, "plain", texts, plan.throughput_requests)
        words = await throughput(url, "words", texts, plan.throughput_requests)
        result.throughput.append((plain, words))


def run(plan: Plan, log_dir: Path, model_path: Path | None = None) -> Result:
    """Every measure on the default model, or on the model folder ``model_path``."""
    path = default_model().path if model_path is None else model_path
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    name = default_model().name if model_path is None else f"the model at {model_path}"
    result = Result(clozes(tokenizer, plan.sentences), model=name)
    port = free_port()
    with Server("maskserve", maskserve_argv(path, port, *SERVE_FLAGS), port, log_dir / "maskserve.log") as server:
        asyncio.run(measure(server.url, plan, result))
    result.averages = os.getloadavg()
    return result


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def share(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


def within(ranks: Sequence[int | None], k: int) -> str:
    hits = sum(r is not None and r <= k for r in ranks)
    return f"{hits}/{len(ranks)} ({hits / len(ranks):.0%})" if ranks else "-"


def median_rank(ranks: Sequence[int | None]) -> str:
    found = [r for r in ranks if r is not None]
    return f"{statistics.median(found):g}" if found else "-"


def render(result: Result, command: str) -> str:
    plain_p50 = percentile(result.latency_ms["plain"], 50)
    words_p50 = percentile(result.latency_ms["words"], 50)
    latency_ratio = words_p50 / plain_p50
    ratios = [words / plain for plain, words in result.throughput]
    throughput_ratio = statistics.median(ratios)
    exact = share(result.exact)
    lines = [
        "# Whole words: cost and accuracy",
        "",
        f"Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC by `{command}`, on {result.model}, "
        f"maskserve {maskserve.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, Python {sys.version.split()[0]}.",
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; load averages at the end {load_averages(result.averages)}.",
        f"{cpu_line()}.",
        f"Server flags beyond the defaults: `{' '.join(SERVE_FLAGS)}`.",
        "",
        f"{len(result.clozes)} cloze sentences (benchmarks/cloze_words.py), each answer 2 or 3 pieces of the "
        f"model's tokenizer; whole words with `max_word_pieces` {PIECES}, `word_beam` {BEAM['width']} "
        f"({'the default' if BEAM['width'] == DEFAULT_WORD_BEAM else f'the default is {DEFAULT_WORD_BEAM}'}), "
        f"`top_k` {TOP_K}.",
        "",
        "| measure | plain fill | whole words | ratio | target | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| c=1 p50 latency, ms | {plain_p50:.1f} | {words_p50:.1f} | {latency_ratio:.2f}x | <= {TARGET_LATENCY:g}x "
        f"| {verdict(latency_ratio <= TARGET_LATENCY)} |",
        f"| c={CONCURRENCY} sentences/s (median of {len(ratios)} pairs; each pair's ratio "
        f"{', '.join(f'{r:.2f}' for r in ratios)}) | {statistics.median(p for p, _ in result.throughput):.1f} "
        f"| {statistics.median(w for _, w in result.throughput):.1f} | {throughput_ratio:.2f}x "
        f"| >= {TARGET_THROUGHPUT:g}x | {verdict(throughput_ratio >= TARGET_THROUGHPUT)} |",
        "",
        "| search | result | target | verdict |",
        "| --- | --- | --- | --- |",
        f"| the beam's top {TOP_K} equals the wide beam's ({WIDE_BEAM}), same words in the same order "
        f"| {sum(result.exact)}/{len(result.exact)} ({exact:.0%}) | >= {TARGET_EXACT:.0%} "
        f"| {verdict(exact >= TARGET_EXACT)} |",
        "",
        f"The answer's rank, looked for in the top {RANK_K}:",
        "",
        "| pipeline | top 1 | top 5 | top 20 | top 100 | median rank where found |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| whole words | {within(result.word_ranks, 1)} | {within(result.word_ranks, 5)} "
        f"| {within(result.word_ranks, 20)} | {within(result.word_ranks, 100)} "
        f"| {median_rank(result.word_ranks)} |",
        f"| plain fill (one piece per mask) | {within(result.plain_ranks, 1)} | {within(result.plain_ranks, 5)} "
        f"| {within(result.plain_ranks, 20)} | {within(result.plain_ranks, 100)} | - |",
        f"| independent decoding given the right length (X-FACTR's) | {within(result.independent_ranks, 1)} "
        f"| {within(result.independent_ranks, 5)} | {within(result.independent_ranks, 20)} "
        f"| {within(result.independent_ranks, 100)} | {median_rank(result.independent_ranks)} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny counts, for the test")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--log-dir", type=Path, default=Path(".bench-logs"))
    parser.add_argument("--beam", type=int, default=DEFAULT_WORD_BEAM, help="the whole-word fills' word_beam")
    parser.add_argument(
        "--model", type=Path, default=None, help="a fill-mask model folder (default: the default model)"
    )
    args = parser.parse_args(argv)
    BEAM["width"] = args.beam
    plan = QUICK if args.quick else FULL
    result = run(plan, args.log_dir, args.model)
    command = "python -m benchmarks.whole_words" + (" --quick" if args.quick else "")
    command += f" --beam {args.beam}" if args.beam != DEFAULT_WORD_BEAM else ""
    command += f" --model {args.model}" if args.model is not None else ""
    publish(render(result, command), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
