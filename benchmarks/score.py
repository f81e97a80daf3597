"""``POST /score`` against minicons offline: pseudo-log-likelihood sentences/s, in one run.

    python -m benchmarks.score                       # both models, about 10 minutes on 2 cores
    python -m benchmarks.score --models default --rounds 1

minicons is a benchmark-only dependency, installed without its declared dependencies (pandas,
accelerate and a pinned numpy, none of which its masked-LM scoring uses)::

    pip install --no-deps minicons==0.3.39 wonderwords pillow

minicons 0.3.39 calls the tokenizer's ``batch_encode_plus``, which transformers 5 removed; calling
the tokenizer itself is what it meant, and :func:`minicons_scorer` puts that call in its place.

For each model (the trained default model; a random model of bert-base's shape) the sentences of
sentences.py, with the mask replaced by a word, are scored (metric ``original``, the sum of every
token's log-probability) by minicons' ``MaskedLMScorer.sequence_score`` in this process at several
batch sizes, and by maskserve's ``/score`` over HTTP at concurrency 1 and 8, each backend a server
of its own. Rounds take turns between them (one system computes at a time, the servers not
measured are paused), and the ratios are taken inside each round, so drift between rounds on a
shared machine hits both sides of a ratio alike. Every maskserve score is compared with minicons'
on the same sentence: the sanity check that both compute the same thing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import torch
import transformers

from maskserve.config.cpus import available_cpus

from .agreement import cpu_line
from .load import is_loopback, percentile
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .run import BACKEND_FLAGS, BACKEND_NEEDS, EXPORT_CACHE, cpu_model
from .sentences import WORD_COUNTS, make_sentences
from .servers import Server, free_port, maskserve_argv

RESULTS = Path(__file__).resolve().parent / "results" / "score.md"
MINICONS_VERSION = "0.3.39"
# The word that takes the mask's place: every sentence of the mix is scored as a plain sentence.
FILLER = "time"
METRIC = "original"
MODELS: dict[str, Callable[[], BenchModel]] = {"default": default_model, "bert-base": bert_base_model}
# One cycle of sentences.py's word counts keeps its length mix exact (3 to 97 words); the default
# model is fast enough for four cycles.
SENTENCES = {"default": 4 * len(WORD_COUNTS), "bert-base": len(WORD_COUNTS)}
# minicons' batch sizes tried, per model. Past a few sentences a batch only gets slower: minicons
# computes the logits over the vocabulary at every position of every copy, padded to the batch's
# longest sentence (on bert-base's shape, 4 is already slower than 1).
BATCH_SIZES = {"default": (1, 2, 4, 8, 16), "bert-base": (1, 2, 4)}
CONCURRENCIES = (1, 8)
# The issue's targets, on bert-base's shape at c=8, against minicons' best offline sentences/s.
TARGET_MODEL = "bert-base"
TARGET_CONCURRENCY = 8
TARGET_TORCH, TARGET_FASTEST = 1.5, 2.5
# The limits are maskserve's defaults (the mix's longest sentence scores 98 tokens, within the
# default 256). The load is not: at c=8 up to 8 x 98 copies wait at once (the default queue holds
# 256), and on bert-base's shape a request at c=8 waits for the others' copies longer than the
# default 30 s; a closed loop of 8 clients measures the server's rate, not its shedding.
SERVE_FLAGS = ("--max-queue", "1024", "--request-timeout", "600")
# A float32 server against float32 minicons: sums of up to 98 log-probabilities, each rounded
# differently by a different batch shape.
FLOAT32_TOLERANCE = 1e-3
TIME_CAP_S = 300.0  # per measurement: every loop stops itself


def score_sentences(count: int) -> list[str]:
    """``count`` sentences of the benchmark's mix, each with its mask replaced by :data:`FILLER`."""
    return make_sentences(count, mask=FILLER)


def minicons_scorer(model: Path) -> Any:
    """minicons' masked-LM scorer on ``model`` (CPU, float32), with the tokenizer call it meant."""
    from minicons import scorer

    loaded = scorer.MaskedLMScorer(str(model), "cpu")
    tokenizer = loaded.tokenizer
    if not hasattr(tokenizer, "batch_encode_plus"):
        # transformers 5 removed batch_encode_plus; the tokenizer's own call takes the same arguments.
        tokenizer.batch_encode_plus = tokenizer.__call__
    return loaded


def minicons_pass(scorer: Any, sentences: Sequence[str], batch_size: int) -> tuple[float, list[float]]:
    """One pass of ``sequence_score`` over ``sentences`` in batches: sentences/s, and each score."""
    scores: list[float] = []
    started = time.perf_counter()
    for start in range(0, len(sentences), batch_size):
        batch = list(sentences[start : start + batch_size])
        scores += scorer.sequence_score(batch, reduction=lambda x: x.sum(0).item(), PLL_metric=METRIC)
    elapsed = time.perf_counter() - started
    return len(sentences) / elapsed, scores


def multiply_adds(config: Any, lengths: Sequence[int], *, attention: bool = True) -> tuple[float, float]:
    """Multiply-adds of scoring texts of ``lengths`` tokens (special tokens included), metric ``original``.

    (minicons at batch size 1, maskserve's torch float32) for a model of BERT's layer layout.
    minicons computes every layer and the head over the vocabulary at every row of every copy;
    maskserve runs the last layer's queries, attention output and feed-forward, and the head, at
    each copy's scored row only. Matrix products only: embeddings, norms and activations are
    left out, and with ``attention=False`` so are the attention's own products (scores, weighted
    sums), which leaves exactly the linear layers.
    """
    d, ff, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    minicons = maskserve = 0.0
    for n in lengths:
        copies = n - 2  # every token but the two special ones is scored
        attend = 2 * n * d if attention else 0  # one row's scores and weighted sum over n rows
        row = 4 * d * d + 2 * d * ff + attend  # one row through one layer
        head = d * d + d * vocab  # the head's transform and its projection onto the vocabulary
        minicons += copies * n * (layers * row + head)
        # Every row through all layers but the last; there, keys and values at every row, and
        # the scored row through the rest of the layer and the head.
        maskserve += copies * (n * ((layers - 1) * row + 2 * d * d) + (2 * d * d + 2 * d * ff + attend) + head)
    return minicons, maskserve


@dataclass
class ScoreLoad:
    """One closed-loop pass over the sentences: each sentence once, each score kept."""

    concurrency: int
    duration_s: float = 0.0
    scores: dict[int, float] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        """Sentences scored (200, with a score) per second."""
        return len(self.scores) / self.duration_s if self.duration_s > 0 else 0.0


async def score_load(url: str, sentences: Sequence[str], *, concurrency: int, time_cap_s: float) -> ScoreLoad:
    """Send every sentence once to ``url`` (``.../score``, a raw text body) from ``concurrency`` clients."""
    host = url.split("//", 1)[-1].split(":", 1)[0]
    if not is_loopback(host):
        raise ValueError(f"load goes to loopback only, not {host!r}")
    result = ScoreLoad(concurrency)
    counter = itertools.count()
    loop = asyncio.get_running_loop()
    timeout = aiohttp.ClientTimeout(total=time_cap_s + 60)

    async def client(session: aiohttp.ClientSession, stop_at: float) -> None:
        while (k := next(counter)) < len(sentences) and loop.time() < stop_at:
            started = time.perf_counter()
            try:
                async with session.post(url, data=sentences[k].encode("utf-8")) as response:
                    body, status = await response.read(), response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                result.statuses[type(exc).__name__] += 1
                continue
            result.latencies_ms.append((time.perf_counter() - started) * 1000)
            result.statuses[str(status)] += 1
            if status == 200:
                score = json.loads(body).get("score")
                if isinstance(score, float) and math.isfinite(score):
                    result.scores[k] = score

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        begun = loop.time()
        await asyncio.gather(*(client(session, begun + time_cap_s) for _ in range(concurrency)))
        result.duration_s = loop.time() - begun
    return result


def system_name(backend: str) -> str:
    return f"maskserve {backend}" if backend != "torch" else "maskserve torch float32"


def score_server(model: BenchModel, backend: str, log_dir: Path) -> Server:
    port = free_port()
    argv = maskserve_argv(model.path, port, *BACKEND_FLAGS[backend], "--cache-dir", str(EXPORT_CACHE), *SERVE_FLAGS)
    return Server(system_name(backend), argv, port, log_dir / f"score-{backend}.log")


@dataclass
class Round:
    """One round of one model: minicons' rate per batch size, and each server's pass per concurrency."""

    minicons: dict[int, float] = field(default_factory=dict)
    loads: dict[tuple[str, int], ScoreLoad] = field(default_factory=dict)

    @property
    def minicons_best(self) -> float:
        return max(self.minicons.values())


@dataclass
class ModelRun:
    model: BenchModel
    key: str
    sentences: list[str]
    mean_tokens: float
    systems: list[str]
    reference: list[float]  # minicons' score of each sentence, at batch size 1
    multiply_adds: tuple[float, float]  # (minicons at batch size 1, maskserve torch float32)
    rounds: list[Round] = field(default_factory=list)


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def run_model(key: str, backends: Sequence[str], rounds: int, log_dir: Path, count: int | None = None) -> ModelRun:
    model = MODELS[key]()
    sentences = score_sentences(count or SENTENCES[key])
    torch.set_num_threads(available_cpus())
    scorer = minicons_scorer(model.path)
    lengths = [len(ids) for ids in scorer.tokenizer(sentences)["input_ids"]]
    _, reference = minicons_pass(scorer, sentences, 1)  # also its warm-up
    servers = [score_server(model, backend, log_dir) for backend in backends]
    run = ModelRun(
        model,
        key,
        sentences,
        sum(lengths) / len(lengths),
        [s.name for s in servers],
        reference,
        multiply_adds(scorer.model.config, lengths),
    )
    try:
        for server in servers:
            log(f"{model.name}: starting {server.name}")
            server.start()
            # Warm-up: every length of the mix once, so no measured pass pays for a first shape.
            asyncio.run(score_load(server.url + "score", sentences, concurrency=8, time_cap_s=TIME_CAP_S))
            server.pause()
        for number in range(rounds):
            round_ = Round()
            order = servers[number % len(servers) :] + servers[: number % len(servers)]
            for batch_size in BATCH_SIZES[key]:
                round_.minicons[batch_size], _ = minicons_pass(scorer, sentences, batch_size)
                log(f"round {number + 1} minicons batch {batch_size}: {round_.minicons[batch_size]:.2f} sentences/s")
            for server in order:
                server.resume()
                for c in CONCURRENCIES:
                    load = asyncio.run(
                        score_load(server.url + "score", sentences, concurrency=c, time_cap_s=TIME_CAP_S)
                    )
                    round_.loads[server.name, c] = load
                    log(f"round {number + 1} {server.name} c={c}: {load.rate:.2f} sentences/s {dict(load.statuses)}")
                server.pause()
            run.rounds.append(round_)
    finally:
        for server in servers:
            server.stop()
    return run


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def largest_difference(run: ModelRun, system: str) -> float:
    """The largest |maskserve - minicons| over every sentence scored in every pass of ``system``."""
    return max(
        (
            abs(score - run.reference[k])
            for (name, _), load in ((s, r.loads[s]) for r in run.rounds for s in r.loads)
            if name == system
            for k, score in load.scores.items()
        ),
        default=math.nan,
    )


def ratio_to_minicons(run: ModelRun, system: str, c: int) -> list[float]:
    return [r.loads[system, c].rate / r.minicons_best for r in run.rounds]


def fastest(run: ModelRun) -> str:
    """The system with the highest median rate at the target concurrency."""
    return max(run.systems, key=lambda s: statistics.median(r.loads[s, TARGET_CONCURRENCY].rate for r in run.rounds))


def model_section(run: ModelRun) -> list[str]:
    n = len(run.sentences)
    lines = [
        f"## {run.model.name}",
        "",
        f"{n} sentences (sentences.py's mix, the mask replaced by {FILLER!r}), {run.mean_tokens:.1f} tokens on "
        f"average, {len(run.reference)} scores; {len(run.rounds)} rounds. Sentences/s: median of the "
        "rounds (min–max); ratios: median of the per-round ratios to minicons' best batch size of that round.",
        "",
        "| system | sentences/s | p50 ms | p90 ms | statuses | largest \\|score − minicons\\| |",
        "|---|---|---|---|---|---|",
    ]
    for b in BATCH_SIZES[run.key]:
        lines.append(f"| minicons, batch size {b} | {spread([r.minicons[b] for r in run.rounds])} | | | | |")
    for system in run.systems:
        for c in CONCURRENCIES:
            loads = [r.loads[system, c] for r in run.rounds]
            latencies = [ms for load in loads for ms in load.latencies_ms]
            statuses = sum((load.statuses for load in loads), Counter())
            lines.append(
                f"| {system}, c={c} | {spread([load.rate for load in loads])} | {percentile(latencies, 50):.0f} | "
                f"{percentile(latencies, 90):.0f} | {', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))} | "
                f"{largest_difference(run, system):.2g} |"
            )
    lines += ["", "| system | / minicons' best, c=1 | / minicons' best, c=8 |", "|---|---|---|"]
    for system in run.systems:
        per_c = [statistics.median(ratio_to_minicons(run, system, c)) for c in CONCURRENCIES]
        lines.append(f"| {system} | " + " | ".join(f"{x:.2f}×" for x in per_c) + " |")
    best = [max(r.minicons, key=r.minicons.__getitem__) for r in run.rounds]
    lines += ["", f"minicons' best batch size, per round: {', '.join(map(str, best))}."]
    torch_name = system_name("torch")
    if torch_name in run.systems:
        diff = largest_difference(run, torch_name)
        verdict = "equal" if diff <= FLOAT32_TOLERANCE else "NOT equal"
        lines.append(
            f"Sanity: {torch_name}'s scores and minicons' are {verdict} within {FLOAT32_TOLERANCE:g} on every "
            f"sentence (largest difference {diff:.2g})."
        )
    minicons_work, maskserve_work = run.multiply_adds
    lines.append(
        f"Work: minicons (batch size 1) computes {minicons_work / maskserve_work:.2f}× the multiply-adds of "
        f"{torch_name} on these sentences ({minicons_work / 1e12:.2f} against {maskserve_work / 1e12:.2f} "
        "trillion): the ratio a float32 server reaches where both compute at the same rate."
    )
    if run.key == TARGET_MODEL:
        lines += ["", *targets(run)]
    return [*lines, ""]


def targets(run: ModelRun) -> list[str]:
    """The issue's targets, as ratios inside each round at c=8."""
    lines = [f"Targets (bert-base's shape, c={TARGET_CONCURRENCY}, against minicons' best offline sentences/s):"]
    checks = [(system_name("torch"), TARGET_TORCH, "torch float32")]
    if run.systems:
        checks.append((fastest(run), TARGET_FASTEST, "the fastest backend"))
    for system, target, what in checks:
        if system not in run.systems:
            continue
        per_round = ratio_to_minicons(run, system, TARGET_CONCURRENCY)
        met = statistics.median(per_round) >= target
        lines.append(
            f"- {what} ({system}): {statistics.median(per_round):.2f}× (per round "
            f"{', '.join(f'{x:.2f}' for x in per_round)}; target ≥ {target}×): {'met' if met else 'NOT met'}"
        )
    return lines


def render(runs: Sequence[ModelRun], command: str) -> str:
    lines = [
        "# POST /score against minicons offline",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; machine: {cpu_model()}, nproc {available_cpus()} "
        f"(os.cpu_count {os.cpu_count()}), Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, minicons {minicons_version()}",
        f"- {cpu_line()}",
        f"- minicons: `MaskedLMScorer(model, 'cpu').sequence_score(batch, reduction=sum)`, metric `{METRIC}`, "
        f"float32, {available_cpus()} torch threads, in this process (no server), at each batch size in "
        "its model's table; its `batch_encode_plus` call is the tokenizer's own call (transformers 5 "
        "removed the method)",
        f"- maskserve: `POST /score` with a raw text body (metric `{METRIC}`), one server per backend on its "
        f"defaults plus `{' '.join(SERVE_FLAGS)}` (the mix's longest sentence scores 98 tokens), each sentence "
        "once per pass by c closed-loop clients; only the measured system runs, the others are paused",
        "",
    ]
    for run in runs:
        lines += model_section(run)
    return "\n".join(lines)


def minicons_version() -> str:
    try:
        from importlib.metadata import version

        return version("minicons")
    except Exception:  # noqa: BLE001  (installed with --target, it may have no metadata on the path)
        return MINICONS_VERSION


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.score", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,bert-base", help="comma-separated: default, bert-base")
    parser.add_argument(
        "--backends", default="torch,openvino,openvino-int8", help=f"comma-separated, of {', '.join(BACKEND_FLAGS)}"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(args_list)
    if importlib.util.find_spec("minicons") is None:
        raise SystemExit(
            f"minicons is not installed: pip install --no-deps minicons=={MINICONS_VERSION} wonderwords pillow"
        )
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if [k for k in keys if k not in MODELS] or [b for b in backends if b not in BACKEND_FLAGS]:
        raise SystemExit(f"--models: choose from {list(MODELS)}; --backends: from {list(BACKEND_FLAGS)}")
    missing = [b for b in backends if b in BACKEND_NEEDS and importlib.util.find_spec(BACKEND_NEEDS[b]) is None]
    if missing:
        raise SystemExit(f"not installed: the module for {', '.join(missing)}")
    runs = [run_model(key, backends, args.rounds, CACHE_DIR / "logs" / "score" / key) for key in keys]
    report = render(runs, " ".join(["python -m benchmarks.score", *args_list]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report, encoding="utf-8")
    print(report)
    log(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
