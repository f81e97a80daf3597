"""Texts longer than the model reads, in one run: a long document with many masks, and ``/score``.

    python -m benchmarks.long_texts             # the full run: 3 minutes on 2 quiet cores, 7 on busy ones
    python -m benchmarks.long_texts --quick     # tiny counts, for the test: about a minute

**Fill-mask.** One fixed document of 4,000 tokens of the default model's tokenizer (sentences.py's
words, every one a single token, its masks replaced by a word), with 20 masks at fixed spread
positions (one at a seeded random word of each twentieth of the text). maskserve reads it in
windows of the model's length around groups of masks. It is sent whole to ``POST /`` (top_k 5):
one client at a time for latency, 8 closed-loop clients for documents/s. The naive way a user
without maskserve would do it is the baseline: for each mask, the 512-token window of the model
centred on it (clamped to the document; other masks in it stay masks), decoded to text, one
``transformers`` fill-mask pipeline call; documents/s is 1 / the time of the 20 calls. Each mask's
top token from maskserve is compared with the naive one (their windows differ: maskserve groups
masks, so a mask is not always at its window's centre).

**/score.** A text of 2,000 tokens, read in windows (each scored token is one masked copy of the
window that holds it), against a text of 500 tokens that the model reads whole, sent twice: once
before the long one and once after it. Per scored token: the work line (multiply-adds from the
model's shape, as benchmarks.score counts them), and from the server's own ``/metrics`` (scraped
before and after each) padded tokens, inference-thread seconds and the process's CPU seconds.

One server runs everything, with the limits the load needs (:data:`SERVE_FLAGS`). The systems take
turns in rounds, the server paused (SIGSTOP) while the naive loop runs in this process, and the
ratios are taken inside each round.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import itertools
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import torch
import transformers

from maskserve.config.cpus import available_cpus
from maskserve.engine.base import specials_around

from . import offline
from .agreement import cpu_line
from .load import is_loopback, percentile
from .models import CACHE_DIR, default_model
from .run import cpu_model, load_averages, log, offline_thread_counts, publish
from .score import multiply_adds
from .sentences import make_sentences
from .servers import Server, free_port, maskserve_argv

RESULTS = Path(__file__).resolve().parent / "results" / "long-texts.md"
TOP_K = 5
SEED = 2024
# The word that takes each sentence's mask's place in the plain text (as in benchmarks.score).
FILLER = "time"
# The model's length: the naive loop's windows, and what maskserve's windows hold.
MODEL_TOKENS = 512
# What the load needs beyond maskserve's defaults: a document's 20 masks (8 by default); /score's
# 2,000-token text (256 scored tokens by default), whose 1,998 copies must fit the queue; and time
# for one 2,000-token text alone (each copy a 512-token window) on a slow machine.
SERVE_FLAGS = (
    "--max-masks-per-text",
    "20",
    "--max-score-tokens",
    "2048",
    "--max-queue",
    "4096",
    "--request-timeout",
    "600",
)
REQUEST_TIMEOUT_S = 600.0
# The targets: maskserve at c=8 against the naive loop, and /score's cost per scored token of a
# text read in windows against one read whole.
TARGET_THROUGHPUT = 3.0
TARGET_SCORE = 1.2
CONCURRENCY = 8


@dataclass(frozen=True)
class Plan:
    """How much one run measures."""

    rounds: int
    latency_requests: int  # c=1, per round
    throughput_requests: int  # c=8, per round
    naive_passes: int  # of the 20 pipeline calls, per round and thread count
    warmup_requests: int  # the document at c=8 before the rounds
    document_tokens: int
    masks: int
    score_long_tokens: int
    score_fit_tokens: int
    fit_copies: int  # how many times the fitting text is scored, per round
    time_cap_s: float  # per measurement


# Two rounds: the long /score text alone is about a million padded tokens (1,998 copies of a
# 512-token window), and the whole run has to stay under ten minutes on 2 shared cores.
FULL = Plan(2, 6, 24, 2, 8, 4000, 20, 2000, 500, 2, 300.0)
# The same document (a shorter one needs no windows of 512), fewer requests, and /score texts
# just past one window and well inside it: a minute or so, for the test.
QUICK = Plan(1, 1, 8, 1, 1, 4000, 20, 560, 250, 1, 60.0)


# -- the texts --------------------------------------------------------------------------------


def plain_units(tokenizer: Any, n_tokens: int, seed: int = SEED) -> list[str]:
    """The words and full stops of a text of exactly ``n_tokens`` tokens, special tokens included:
    sentences.py's sentences in order, their mask replaced by :data:`FILLER`, cut to length.

    Every unit is one token (sentences.py's words are, and so is the full stop)."""
    inner = n_tokens - sum(specials_around(tokenizer))
    units: list[str] = []
    for sentence in make_sentences(inner // 4 + 1, seed=seed, mask=FILLER):
        units += [*sentence.removesuffix(".").split(), "."]
        if len(units) >= inner:
            return units[:inner]
    raise RuntimeError(f"too few sentences for {n_tokens} tokens; this is a bug")


def join_units(units: Sequence[str]) -> str:
    """The units as prose: words spaced, full stops against their word."""
    return "".join(unit if unit == "." else f" {unit}" for unit in units).strip()


def plain_text(tokenizer: Any, n_tokens: int, seed: int = SEED) -> str:
    """A text of exactly ``n_tokens`` tokens, special tokens included (see :func:`plain_units`)."""
    text = join_units(plain_units(tokenizer, n_tokens, seed))
    if len(tokenizer(text)["input_ids"]) != n_tokens:
        raise RuntimeError(f"the plain text is not {n_tokens} tokens long; this is a bug")
    return text


@dataclass(frozen=True)
class Document:
    """The fill-mask document: its text, its token ids, and its masks' token positions (ascending)."""

    text: str
    input_ids: tuple[int, ...]
    masks: tuple[int, ...]


def masked_document(tokenizer: Any, n_tokens: int, n_masks: int, seed: int = SEED) -> Document:
    """A text of ``n_tokens`` tokens with ``n_masks`` masks, one at a seeded random word (never a
    full stop) of each of ``n_masks`` equal stretches of the text: fixed, and spread over it."""
    units = plain_units(tokenizer, n_tokens, seed)
    rng = random.Random(seed)
    before, _ = specials_around(tokenizer)
    chosen: list[int] = []
    for k in range(n_masks):
        stretch = range(k * len(units) // n_masks, (k + 1) * len(units) // n_masks)
        chosen.append(rng.choice([i for i in stretch if units[i] != "."]))
    for i in chosen:
        units[i] = tokenizer.mask_token
    text = join_units(units)
    input_ids = tuple(tokenizer(text)["input_ids"])
    masks = tuple(i for i, token in enumerate(input_ids) if token == tokenizer.mask_token_id)
    if len(input_ids) != n_tokens or masks != tuple(i + before for i in chosen):
        raise RuntimeError("the document's tokens are not its units; this is a bug")
    return Document(text, input_ids, masks)


@dataclass(frozen=True)
class NaiveWindow:
    """One naive pipeline call: the window of the model's length centred on one mask."""

    text: str  # the window's tokens decoded (special tokens around it are the pipeline's to add)
    start: int  # the document position of its first token
    mask: int  # the document position of the mask it answers
    nth: int  # which of the window's masks that is: the pipeline answers them in text order


def naive_windows(document: Document, tokenizer: Any, length: int = MODEL_TOKENS) -> list[NaiveWindow]:
    """For each mask, the run of ``length`` - 2 of the document's tokens centred on it, clamped to
    the document (its special tokens excluded), decoded; the pipeline adds [CLS] and [SEP]."""
    before, after = specials_around(tokenizer)
    inner = length - before - after
    lowest, highest = before, len(document.input_ids) - after  # the document's own tokens
    result = []
    for position in document.masks:
        start = max(lowest, min(position - inner // 2, highest - inner))
        ids = document.input_ids[start : start + inner]
        nth = sum(1 for m in document.masks if start <= m < position)
        result.append(NaiveWindow(tokenizer.decode(list(ids)), start, position, nth))
    return result


def naive_pass(pipe: Any, windows: Sequence[NaiveWindow]) -> tuple[float, list[list[int]]]:
    """The naive loop once: seconds for all its calls, and each mask's top_k tokens."""
    tokens: list[list[int]] = []
    started = time.perf_counter()
    for window in windows:
        result = pipe(window.text, top_k=TOP_K)
        per_mask = result if result and isinstance(result[0], list) else [result]  # one mask: unwrapped
        tokens.append([p["token"] for p in per_mask[window.nth]])
    return time.perf_counter() - started, tokens


# -- maskserve ----------------------------------------------------------------------------------


@dataclass
class DocumentLoad:
    """One closed-loop pass sending the document: latencies, statuses, and each mask's top tokens."""

    concurrency: int
    duration_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    answered: int = 0  # 200s with one list of top_k predictions per mask
    malformed: int = 0  # 200s without that shape
    differing: int = 0  # answers whose top tokens are not the first answer's
    tokens: list[list[int]] = field(default_factory=list)  # the first answer's, per mask
    windows: str = ""  # X-Text-Windows

    @property
    def rate(self) -> float:
        """Documents answered per second."""
        return self.answered / self.duration_s if self.duration_s > 0 else 0.0


async def document_load(
    url: str, document: Document, *, concurrency: int, requests: int, time_cap_s: float
) -> DocumentLoad:
    """Send ``document`` ``requests`` times to ``url`` (``POST /``, JSON, top_k 5) from
    ``concurrency`` clients, each as soon as its previous answer is back."""
    host = url.split("//", 1)[-1].split(":", 1)[0]
    if not is_loopback(host):
        raise ValueError(f"load goes to loopback only, not {host!r}")
    body = json.dumps({"inputs": document.text, "parameters": {"top_k": TOP_K}}).encode("utf-8")
    headers = {"Content-Type": "application/json", "X-Request-Timeout": f"{REQUEST_TIMEOUT_S:g}"}
    result = DocumentLoad(concurrency)
    counter = itertools.count()
    loop = asyncio.get_running_loop()

    async def client(session: aiohttp.ClientSession, stop_at: float) -> None:
        while next(counter) < requests and loop.time() < stop_at:
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    raw, status = await response.read(), response.status
                    result.windows = response.headers.get("X-Text-Windows", result.windows)
            except (aiohttp.ClientError, TimeoutError) as exc:
                result.statuses[type(exc).__name__] += 1
                continue
            result.latencies_ms.append((time.perf_counter() - started) * 1000)
            result.statuses[str(status)] += 1
            if status != 200:
                continue
            tokens = answer_tokens(json.loads(raw), len(document.masks))
            if tokens is None:
                result.malformed += 1
                continue
            result.answered += 1
            if not result.tokens:
                result.tokens = tokens
            elif [t[0] for t in tokens] != [t[0] for t in result.tokens]:
                result.differing += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        begun = loop.time()
        await asyncio.gather(*(client(session, begun + time_cap_s) for _ in range(concurrency)))
        result.duration_s = loop.time() - begun
    return result


def answer_tokens(answer: Any, masks: int) -> list[list[int]] | None:
    """Each mask's predicted tokens in a fill-mask answer of ``masks`` masks; None if it is not one."""
    if not isinstance(answer, list) or len(answer) != masks:
        return None
    tokens: list[list[int]] = []
    for predictions in answer:
        if not isinstance(predictions, list) or len(predictions) != TOP_K:
            return None
        ids = [p.get("token") for p in predictions if isinstance(p, dict)]
        ints = [token for token in ids if isinstance(token, int)]
        if len(ints) != TOP_K:
            return None
        tokens.append(ints)
    return tokens


def scrape(server: Server) -> dict[str, float]:
    """The sums of the server's forward-pass histograms (all models) and its process's CPU seconds
    (every thread's), from one scrape of /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(server.url + "metrics", timeout=30) as response:
        text = response.read().decode()
    wanted = {
        "maskserve_batch_padded_tokens_sum": "padded_tokens",
        "maskserve_inference_duration_seconds_sum": "forward_s",
        "maskserve_inference_duration_seconds_count": "batches",
        "process_cpu_seconds_total": "cpu_s",
    }
    sums = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                sums[wanted[sample.name]] += sample.value
    return sums


@dataclass
class Work:
    """What some requests cost the server, from /metrics before and after them, and the wall time."""

    texts: int
    scored_tokens: int  # /score's; the documents' masks for fill-mask
    wall_s: float
    padded_tokens: float
    forward_s: float  # the inference thread's time in forward passes (and their top-k)
    batches: float
    cpu_s: float  # the server process's CPU time, every thread
    windows: list[int] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)

    def per_token(self, what: str) -> float:
        value: float = getattr(self, what)
        return value / self.scored_tokens if self.scored_tokens else math.nan

    def __add__(self, other: Work) -> Work:
        return Work(
            self.texts + other.texts,
            self.scored_tokens + other.scored_tokens,
            self.wall_s + other.wall_s,
            self.padded_tokens + other.padded_tokens,
            self.forward_s + other.forward_s,
            self.batches + other.batches,
            self.cpu_s + other.cpu_s,
            self.windows + other.windows,
            self.statuses + other.statuses,
        )


def measured(server: Server, send: Any) -> tuple[Any, dict[str, float]]:
    """``send()``'s result, and the growth of the server's forward-pass sums while it ran."""
    before = scrape(server)
    result = send()
    after = scrape(server)
    return result, {key: after[key] - before[key] for key in before}


def copy_multiply_adds(config: Any, n_tokens: int) -> float:
    """The multiply-adds of one scoring copy of ``n_tokens`` tokens in maskserve (benchmarks.score's
    count, which takes a text of n tokens, two of them special, as n - 2 such copies)."""
    return multiply_adds(config, [n_tokens])[1] / (n_tokens - 2)


def score_work(server: Server, text: str, copies: int, scored: int) -> Work:
    """``text`` scored ``copies`` times, one request at a time (raw body, metric ``original``)."""
    statuses: Counter[str] = Counter()
    windows: list[int] = []

    def send() -> float:
        started = time.perf_counter()
        for _ in range(copies):
            request = urllib.request.Request(
                server.url + "score",
                data=text.encode("utf-8"),
                headers={"X-Request-Timeout": f"{REQUEST_TIMEOUT_S:g}"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S + 60) as response:
                    statuses[str(response.status)] += 1
                    windows.append(int(json.loads(response.read())["windows"]))
            except urllib.error.HTTPError as exc:
                statuses[str(exc.code)] += 1
        return time.perf_counter() - started

    wall_s, sums = measured(server, send)
    answered = statuses["200"]
    return Work(answered, answered * scored, wall_s, **sums, windows=windows, statuses=statuses)


# -- one run ------------------------------------------------------------------------------------


@dataclass
class Round:
    naive_s: dict[int, float] = field(default_factory=dict)  # torch threads -> the best pass's seconds
    latency: DocumentLoad | None = None
    throughput: DocumentLoad | None = None
    latency_work: dict[str, float] = field(default_factory=dict)  # /metrics growth over the c=1 pass
    throughput_work: dict[str, float] = field(default_factory=dict)  # and over the c=8 pass
    score_long: Work | None = None
    score_fit: Work | None = None

    @property
    def naive_rate(self) -> float:
        """Documents/s of the naive loop: its best pass of the round, at its best thread count."""
        return 1 / min(self.naive_s.values())

    @property
    def throughput_ratio(self) -> float:
        return self.throughput.rate / self.naive_rate if self.throughput else math.nan

    def score_ratio(self, what: str) -> float:
        if self.score_long is None or self.score_fit is None:
            return math.nan
        return self.score_long.per_token(what) / self.score_fit.per_token(what)


@dataclass
class LongRun:
    plan: Plan
    document: Document
    naive: list[NaiveWindow]
    naive_tokens: list[list[int]]  # each mask's top_k from the naive loop
    score_long: str
    score_fit: str
    scored: tuple[int, int]  # scored tokens of the long and of the fitting text
    fit_copies: int
    # The work line: maskserve's multiply-adds per scored token, of the long and of the fitting text.
    work_line: tuple[float, float]
    rounds: list[Round] = field(default_factory=list)
    steps: Steps | None = None
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)


def run(plan: Plan, log_dir: Path = CACHE_DIR / "logs" / "long-texts") -> LongRun:
    model = default_model()
    torch.set_num_threads(available_cpus())
    pipe = offline.load_pipeline(str(model.path))
    tokenizer = pipe.tokenizer
    document = masked_document(tokenizer, plan.document_tokens, plan.masks)
    windows = naive_windows(document, tokenizer)
    _, naive_tokens = naive_pass(pipe, windows)  # also its warm-up
    long_text = plain_text(tokenizer, plan.score_long_tokens, SEED + 1)
    fit_text = plain_text(tokenizer, plan.score_fit_tokens, SEED + 2)
    specials = sum(specials_around(tokenizer))
    scored = (plan.score_long_tokens - specials, plan.score_fit_tokens - specials)
    result = LongRun(
        plan,
        document,
        windows,
        naive_tokens,
        long_text,
        fit_text,
        scored,
        plan.fit_copies,
        (
            copy_multiply_adds(pipe.model.config, MODEL_TOKENS),
            copy_multiply_adds(pipe.model.config, plan.score_fit_tokens),
        ),
        load_before=os.getloadavg(),
    )
    port = free_port()
    server = Server("maskserve", maskserve_argv(model.path, port, *SERVE_FLAGS), port, log_dir / "maskserve.log")
    with server:
        log(f"started maskserve {' '.join(SERVE_FLAGS)}")
        # Warm-up: the document at c=8 and both /score texts once, so no measured pass pays for a first shape.
        # (The long /score text's copies are batches of 512-token rows, which the document's windows warm.)
        asyncio.run(
            document_load(server.url, document, concurrency=CONCURRENCY, requests=plan.warmup_requests, time_cap_s=300)
        )
        score_work(server, fit_text, 1, scored[1])
        server.pause()
        for number in range(plan.rounds):
            round_ = Round()
            steps: list[Callable[[Round], None]] = [
                lambda r: measure_naive(pipe, windows, plan, r),
                lambda r: measure_documents(server, document, plan, r),
                lambda r: measure_score(server, result, r),
            ]
            turn = number % len(steps)
            for step in steps[turn:] + steps[:turn]:  # take turns: drift hits each side alike
                step(round_)
            result.rounds.append(round_)
            log(
                f"round {number + 1}/{plan.rounds}: c=8 / naive {round_.throughput_ratio:.2f}×, /score long / "
                f"fitting per scored token: forward {round_.score_ratio('forward_s'):.2f}×"
            )
    result.steps = profile(pipe, document, windows, model.path)
    result.load_after = os.getloadavg()
    return result


def measure_naive(pipe: Any, windows: Sequence[NaiveWindow], plan: Plan, round_: Round) -> None:
    for threads in offline_thread_counts():  # its best thread count, as the offline limit gets
        torch.set_num_threads(threads)
        for _ in range(plan.naive_passes):
            seconds, _ = naive_pass(pipe, windows)
            round_.naive_s[threads] = min(seconds, round_.naive_s.get(threads, math.inf))
    torch.set_num_threads(available_cpus())
    log(
        f"  naive loop: {round_.naive_rate:.2f} documents/s ("
        + ", ".join(f"{t} threads {1 / s:.2f}" for t, s in sorted(round_.naive_s.items()))
        + ")"
    )


def measure_documents(server: Server, document: Document, plan: Plan, round_: Round) -> None:
    server.resume()
    try:
        round_.latency, round_.latency_work = measured(
            server,
            lambda: asyncio.run(
                document_load(
                    server.url,
                    document,
                    concurrency=1,
                    requests=plan.latency_requests,
                    time_cap_s=plan.time_cap_s,
                )
            ),
        )
        round_.throughput, round_.throughput_work = measured(
            server,
            lambda: asyncio.run(
                document_load(
                    server.url,
                    document,
                    concurrency=CONCURRENCY,
                    requests=plan.throughput_requests,
                    time_cap_s=plan.time_cap_s,
                )
            ),
        )
    finally:
        server.pause()
    for load in (round_.latency, round_.throughput):
        log(
            f"  maskserve c={load.concurrency}: {load.rate:.2f} documents/s, "
            f"p50 {percentile(load.latencies_ms, 50):.0f} ms, {dict(load.statuses)}, windows {load.windows}"
        )


def measure_score(server: Server, run_: LongRun, round_: Round) -> None:
    # The fitting text's copies on both sides of the long text (one long request, a minute or so):
    # drift over that minute then hits both sides of the ratio alike.
    before = run_.fit_copies // 2
    server.resume()
    try:
        fit = score_work(server, run_.score_fit, before, run_.scored[1])
        round_.score_long = score_work(server, run_.score_long, 1, run_.scored[0])
        round_.score_fit = fit + score_work(server, run_.score_fit, run_.fit_copies - before, run_.scored[1])
    finally:
        server.pause()
    for name, work in (("long", round_.score_long), ("fitting", round_.score_fit)):
        log(
            f"  /score {name}: {work.scored_tokens} scored tokens in {work.wall_s:.1f} s, forward "
            f"{work.per_token('forward_s') * 1000:.2f} ms and {work.per_token('padded_tokens'):.0f} padded tokens "
            f"per scored token, windows {work.windows}, {dict(work.statuses)}"
        )


class _Timer:
    """The engine's progress hook (model_api.Progress): when its forward pass ended, every text wanted."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.forward_s = 0.0

    def forward_done(self) -> None:
        self.forward_s = time.perf_counter() - self.started

    def wanted(self, index: int) -> bool:
        return True


def best_of(call: Any, repeat: int = 3) -> float:
    """The least seconds of ``repeat`` calls: the step's own cost, less the machine's noise."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


@dataclass(frozen=True)
class Steps:
    """Where one document's time goes, step by step, in this process on one torch thread."""

    maskserve: dict[str, float]  # step -> seconds, for the whole document
    naive: dict[str, float]  # step -> seconds, for one pipeline call (of 20)
    answer_bytes: int  # maskserve's answer to the document


def profile(pipe: Any, document: Document, windows: Sequence[NaiveWindow], model_path: Path) -> Steps:
    torch.set_num_threads(1)
    try:
        maskserve, answer_bytes = maskserve_steps(document, model_path)
        return Steps(maskserve, naive_steps(pipe, windows[len(windows) // 2]), answer_bytes)
    finally:
        torch.set_num_threads(available_cpus())


def maskserve_steps(document: Document, model_path: Path) -> tuple[dict[str, float], int]:
    """Seconds of each step of one document in maskserve's own code, and its answer's bytes: the
    plan (tokenizing, cutting the windows), the forward pass over the windows and its top-k, the
    fold (each of the masks x top_k predictions decoded with the whole document as its
    ``sequence``, and the JSON)."""
    from maskserve.config.bounds import settings_from
    from maskserve.engine import load_engine
    from maskserve.serving.work_queue import Answer
    from maskserve.tasks.fill_mask import FillMask
    from maskserve.tasks.fill_mask_request import FillMaskRequest, RequestParser, response_body

    engine = load_engine(str(model_path), threads=1)
    task = FillMask(RequestParser(settings_from({"max_masks_per_text": len(document.masks)})))
    request = FillMaskRequest(texts=(document.text,), batched=False, top_k=TOP_K, targets=None)
    plan = task.plan(request, engine)
    steps = {"plan: tokenize, cut the windows": best_of(lambda: task.plan(request, engine))}
    predictions = engine.predict(plan.queries)  # warm-up
    forward, after = [], []
    for _ in range(3):
        timer = _Timer()
        engine.predict(plan.queries, timer)
        forward.append(timer.forward_s)
        after.append(time.perf_counter() - timer.started - timer.forward_s)
    steps[f"forward pass over the {len(plan.queries)} windows"] = min(forward)
    steps["top-k after the forward pass"] = min(after)
    answers = [Answer(p, 0.0, 0.0, len(predictions)) for p in predictions]
    folded = task.fold(plan, answers, engine)
    steps[f"fold: {plan.texts[0].decoded_predictions} sequences of the document (spliced), JSON"] = best_of(
        lambda: task.fold(plan, answers, engine)
    )
    return steps, len(response_body(request, [a.json for a in folded]))


def naive_steps(pipe: Any, window: NaiveWindow) -> dict[str, float]:
    """Seconds of one naive pipeline call, and of its model's two parts on the same window: the
    encoder, and the masked-LM head, which the pipeline runs at every one of the window's rows."""
    inputs = pipe.tokenizer(window.text, return_tensors="pt")
    model = pipe.model
    with torch.inference_mode():
        hidden = model.base_model(**inputs).last_hidden_state
        steps = {
            "pipeline call, in all": best_of(lambda: pipe(window.text, top_k=TOP_K)),
            "encoder": best_of(lambda: model.base_model(**inputs)),
            f"head over the vocabulary at all {hidden.shape[1]} rows": best_of(lambda: model.cls(hidden)),
        }
    return steps


# -- the report ---------------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """The median, and the range when the values differ."""
    if not values:
        return "–"
    low, mid, high = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return mid if low == high else f"{mid} ({low}–{high})"


def agreement(run_: LongRun) -> tuple[int, int, int]:
    """Masks whose top token from maskserve is the naive loop's; whose naive top token is among
    maskserve's top_k; and all masks. From the first answer of the last round's c=1 pass."""
    load = next((r.latency for r in reversed(run_.rounds) if r.latency and r.latency.tokens), None)
    if load is None:
        return 0, 0, len(run_.document.masks)
    top1 = sum(1 for ms, naive in zip(load.tokens, run_.naive_tokens) if ms[0] == naive[0])
    in_top_k = sum(1 for ms, naive in zip(load.tokens, run_.naive_tokens) if naive[0] in ms)
    return top1, in_top_k, len(run_.document.masks)


def statuses_text(statuses: Counter[str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))


def render(run_: LongRun, command: str) -> str:
    plan, rounds = run_.plan, run_.rounds
    latency = [r.latency for r in rounds if r.latency]
    throughput = [r.throughput for r in rounds if r.throughput]
    c1 = [ms for load in latency for ms in load.latencies_ms]
    c8 = [ms for load in throughput for ms in load.latencies_ms]
    windows_seen = {load.windows for load in (*latency, *throughput)}
    naive_rates = [r.naive_rate for r in rounds]
    ratios = [r.throughput_ratio for r in rounds]
    top1, in_top_k, masks = agreement(run_)
    differing = sum(load.differing + load.malformed for load in (*latency, *throughput))
    lines = [
        "# Long texts: a 4,000-token document, and /score past the model's length",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; machine: {cpu_model()}, nproc {available_cpus()} "
        f"(os.cpu_count {os.cpu_count()}), Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; load average (1/5/15 min) {load_averages(run_.load_before)} before, "
        f"{load_averages(run_.load_after)} after",
        f"- {cpu_line()}",
        f"- model: the default model (2-layer BERT, hidden 128, {MODEL_TOKENS} tokens), torch float32",
        f"- maskserve: one server, `python -m maskserve --model DEFAULT {' '.join(SERVE_FLAGS)}` (every other "
        f"flag at its default), each request with `X-Request-Timeout: {REQUEST_TIMEOUT_S:g}`; paused (SIGSTOP) "
        "while the naive loop runs",
        f"- naive loop: `pipeline('fill-mask')` in this process, one call per mask on the {MODEL_TOKENS}-token "
        f"window centred on it (clamped to the document, the other masks in it kept), top_k {TOP_K}; "
        f"documents/s = 1 / the time of its {masks} calls: the best of {plan.naive_passes} passes a round at "
        f"each torch thread count of {offline_thread_counts()}",
        f"- {len(rounds)} rounds, the three measurements (naive loop, maskserve, /score) taking turns; ratios are "
        "medians of the per-round ratios",
        "",
        "## Fill-mask: one document, 20 masks",
        "",
        f"The document: {len(run_.document.input_ids)} tokens ({len(run_.document.text)} characters), "
        f"{masks} masks at token positions {', '.join(map(str, run_.document.masks))}; "
        f"maskserve reads it in {', '.join(sorted(windows_seen)) or '?'} windows (`X-Text-Windows`). "
        f"Requests per round: {plan.latency_requests} at c=1, {plan.throughput_requests} at c={CONCURRENCY}.",
        "",
        "| system | documents/s | p50 ms | p90 ms | statuses |",
        "|---|---|---|---|---|",
        f"| naive loop ({masks} pipeline calls) | {spread(naive_rates)} | "
        f"{1000 * statistics.median(min(r.naive_s.values()) for r in rounds):.0f} | | |",
        f"| maskserve, c=1 | {spread([load.rate for load in latency])} | {percentile(c1, 50):.0f} | "
        f"{percentile(c1, 90):.0f} | {statuses_text(sum((load.statuses for load in latency), Counter()))} |",
        f"| maskserve, c={CONCURRENCY} | {spread([load.rate for load in throughput])} | {percentile(c8, 50):.0f} | "
        f"{percentile(c8, 90):.0f} | {statuses_text(sum((load.statuses for load in throughput), Counter()))} |",
        "",
        f"maskserve c={CONCURRENCY} / naive loop, documents/s: "
        f"**{against(statistics.median(ratios), TARGET_THROUGHPUT)}×** (per round "
        f"{', '.join(f'{x:.2f}' for x in ratios)}; target ≥ {TARGET_THROUGHPUT:g}×): "
        f"{verdict(statistics.median(ratios) >= TARGET_THROUGHPUT)}.",
        "",
        f"Agreement with the naive loop: maskserve's top token is the naive loop's on {top1} of {masks} masks; "
        f"the naive top token is among maskserve's top {TOP_K} on {in_top_k} of {masks} (their windows differ: "
        "maskserve centres a window on a group of masks, the naive loop on each mask). "
        f"Answers that differed from the first one, or were not {masks} × {TOP_K} predictions: {differing}.",
        "",
        *steps_section(run_),
        *score_section(run_),
    ]
    return "\n".join(lines) + "\n"


def per_document(run_: LongRun, concurrency: int, key: str, scale: float = 1000.0) -> list[float]:
    """One round's growth of a /metrics sum over its pass at ``concurrency``, per document answered."""
    values = []
    for r in run_.rounds:
        load, work = (r.latency, r.latency_work) if concurrency == 1 else (r.throughput, r.throughput_work)
        if load and load.answered and key in work:
            values.append(work[key] / load.answered * scale)
    return values


def steps_section(run_: LongRun) -> list[str]:
    """Where a document's time goes: the server's own figures per document at c=1 and c=8, and each
    step of maskserve and of the naive loop run in this process."""
    c1 = [ms for r in run_.rounds if r.latency for ms in r.latency.latencies_ms]
    wall_c8 = [1000 / r.throughput.rate for r in run_.rounds if r.throughput and r.throughput.rate]
    rows = []
    for c, wall in ((1, f"{percentile(c1, 50):.0f} (p50)"), (CONCURRENCY, f"{spread(wall_c8, '{:.0f}')} (1 / rate)")):
        cells = [
            spread(per_document(run_, c, "forward_s"), "{:.0f}"),
            spread(per_document(run_, c, "cpu_s"), "{:.0f}"),
            spread(per_document(run_, c, "batches", 1.0), "{:.1f}"),
            spread(per_document(run_, c, "padded_tokens", 1.0), "{:.0f}"),
        ]
        rows.append(f"| c={c} | {wall} | {' | '.join(cells)} |")
    lines = [
        "Where one document's time goes. The server, per document (its `/metrics` over each pass):",
        "",
        "| | wall ms | inference thread ms | server CPU ms (every thread) | forward passes | padded tokens |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "Step by step in this process, one torch thread, each step alone (the least of 3 runs):",
        "",
        "| step | ms |",
        "|---|---|",
    ]
    steps = run_.steps
    if steps is None:
        return [*lines, "", "(not measured)", ""]
    lines += [f"| maskserve: {step} | {s * 1000:.1f} |" for step, s in steps.maskserve.items()]
    lines.append(f"| maskserve, all of the above | {sum(steps.maskserve.values()) * 1000:.1f} |")
    calls = len(run_.document.masks)
    lines += [f"| naive loop, one call: {step} | {s * 1000:.1f} |" for step, s in steps.naive.items()]
    naive_call = steps.naive["pipeline call, in all"]
    lines.append(f"| naive loop, {calls} calls | {naive_call * calls * 1000:.1f} |")
    own = sum(steps.maskserve.values())
    fold = next(v for k, v in steps.maskserve.items() if k.startswith("fold"))
    forward = next(v for k, v in steps.maskserve.items() if k.startswith("forward"))
    head = next(v for k, v in steps.naive.items() if k.startswith("head"))
    plan = next(v for k, v in steps.maskserve.items() if k.startswith("plan"))
    c8_rates = [r.throughput.rate for r in run_.rounds if r.throughput]
    lines += [
        "",
        f"Of maskserve's own steps, the fold is {100 * fold / own:.0f}% "
        f"(each of the {len(run_.document.masks) * TOP_K} predictions' `sequence` is the whole "
        f"{len(run_.document.input_ids)}-token document with its candidate in, "
        "its mask's segment decoded and spliced into the document decoded once; "
        f"{steps.answer_bytes / 1e6:.2f} MB of JSON) and the forward pass {100 * forward / own:.0f}%. "
        f"Of a naive call, the masked-LM head over the vocabulary at every row is {100 * head / naive_call:.0f}%; "
        "maskserve runs it at the masks only.",
        "",
        "The plan and the fold of a long text run on the server's one tokenizer thread: at most "
        f"{1 / (fold + plan):.2f} documents/s (1 / their {1000 * (fold + plan):.0f} ms) whatever the concurrency; "
        f"at c={CONCURRENCY} the server served {spread(c8_rates)}.",
        "",
    ]
    return lines


SCORE_MEASURES = (
    ("padded_tokens", "padded tokens", 1.0, "{:.0f}"),
    ("forward_s", "forward ms", 1000.0, "{:.2f}"),
    ("cpu_s", "server CPU ms", 1000.0, "{:.2f}"),
    ("wall_s", "wall ms", 1000.0, "{:.2f}"),
)


def score_section(run_: LongRun) -> list[str]:
    plan = run_.plan
    pairs = [(r.score_long, r.score_fit) for r in run_.rounds if r.score_long and r.score_fit]
    work_long, work_fit = run_.work_line
    lines = [
        "## /score: a text read in windows against one read whole",
        "",
        f"A text of {plan.score_long_tokens} tokens ({run_.scored[0]} scored, each one copy of the "
        f"{MODEL_TOKENS}-token window that holds it, with the token masked) against a text of "
        f"{plan.score_fit_tokens} tokens ({run_.scored[1]} scored) that the model reads whole, sent "
        f"{run_.fit_copies} times, half before the long one and half after it; one request at a time, metric "
        "`original`. Per scored token: the server's `/metrics` before and after (`maskserve_batch_padded_tokens`; "
        "`maskserve_inference_duration_seconds`, the inference thread's time; `process_cpu_seconds_total`, "
        "every thread's CPU), the client's clock, and the work line: the multiply-adds of one copy, counted "
        "from the model's shape as `benchmarks.score` counts them.",
        "",
        "| text | windows | multiply-adds (millions) | " + " | ".join(m[1] for m in SCORE_MEASURES) + " | statuses |",
        "|---|---|---|" + "---|" * len(SCORE_MEASURES) + "---|",
    ]
    for name, works, work in (
        ("long", [p[0] for p in pairs], work_long),
        ("fitting", [p[1] for p in pairs], work_fit),
    ):
        seen = sorted({w for one in works for w in one.windows})
        cells = [spread([w.per_token(key) * scale for w in works], fmt) for key, _, scale, fmt in SCORE_MEASURES]
        statuses = sum((w.statuses for w in works), Counter())
        lines.append(
            f"| {name} | {', '.join(map(str, seen))} | {work / 1e6:.1f} | {' | '.join(cells)} | "
            f"{statuses_text(statuses)} |"
        )
    per_round = {key: [long.per_token(key) / fit.per_token(key) for long, fit in pairs] for key, *_ in SCORE_MEASURES}
    if not pairs:
        return [*lines, "", "(not measured)", ""]
    work_ratio = work_long / work_fit
    forward = statistics.median(per_round["forward_s"])
    forward_rounds = ", ".join(f"{x:.2f}" for x in per_round["forward_s"])
    lines += [
        "",
        f"Long / fitting, per scored token (target ≤ {TARGET_SCORE:g}×):",
        "",
        f"- the work line: multiply-adds **{against(work_ratio, TARGET_SCORE)}×**, padded tokens "
        f"{statistics.median(per_round['padded_tokens']):.2f}×: {verdict(work_ratio <= TARGET_SCORE)}",
        f"- measured: forward time **{against(forward, TARGET_SCORE)}×** (per round {forward_rounds}): "
        f"{verdict(forward <= TARGET_SCORE)}; server CPU {statistics.median(per_round['cpu_s']):.2f}×, wall time "
        f"{statistics.median(per_round['wall_s']):.2f}×",
        "",
    ]
    return lines


def against(ratio: float, target: float) -> str:
    """``ratio`` to two decimals, or three where two would read as the target itself."""
    return f"{ratio:.3f}" if f"{ratio:.2f}" == f"{target:.2f}" else f"{ratio:.2f}"


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.long_texts", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny counts: seconds, for the test")
    parser.add_argument("--rounds", type=int, default=0, help="override the plan's round count")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(args_list)
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    result = run(plan)
    publish(render(result, " ".join(["python -m benchmarks.long_texts", *args_list])), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
