"""One command, one run: maskserve side by side with the seed's design and the offline pipeline.

    python -m benchmarks.run --quick     # ~20 minutes on 2 cores
    python -m benchmarks.run             # the full run: more requests and rounds
    python -m benchmarks.run --backends torch --no-extras   # maskserve on torch only
    python -m benchmarks.run --quick --models bert-base --no-extras \
        --backends torch,torch-bf16,onnxruntime,openvino,openvino-bf16,openvino-int8   # the CPU's matrix units

For each model (the default model; a random model of bert-base's shape) it starts the servers as
subprocesses, then repeats rounds that take turns between (a) the seed design, (c) maskserve on
each backend and precision (torch; torch bf16, onnxruntime, openvino, openvino bf16 and openvino
int8 when installed) in closed loops at each concurrency,
(b) the offline pipeline at several batch sizes, plain and length-sorted, and (d) concurrency 1
*interleaved* (interleaved.py): every sentence sent to each server in turn and to one offline
pipeline call. On the default model two extra systems run at concurrency 64: maskserve with
tracing on, and maskserve with ``--workers 2``.
Numbers drift between runs on a shared machine (by more than the differences measured, minutes
apart), so the table reports medians of the
rounds and, above all, ratios taken inside each round. Only one system computes at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import os
import platform
import statistics
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from maskserve.config.cpus import available_cpus
from maskserve.engine.cpu import (
    describe_features,
    int8_in_effect,
    isa_cap_in_effect,
    matrix_features,
    precision_in_effect,
)

from . import offline
from .interleaved import OFFLINE, Interleaved, run_interleaved
from .load import Expected, LoadResult, percentile, run_load
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .otlp_sink import OtlpSink
from .sentences import make_sentences
from .servers import RssSampler, Server, free_port, maskserve_argv, rss_bytes, seed_argv

RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"
SEED, MASKSERVE, MASKSERVE_ORT = "seed design", "maskserve", "maskserve onnxruntime"
MASKSERVE_BF16, MASKSERVE_OV, MASKSERVE_OV_BF16 = "maskserve bf16", "maskserve openvino", "maskserve openvino bf16"
MASKSERVE_OV_INT8 = "maskserve openvino int8"
# maskserve's system name per --backends entry, and the flags that start it; the onnxruntime and
# openvino graphs are cached under .bench-cache/.
BACKEND_SYSTEMS = {
    "torch": MASKSERVE,
    "torch-bf16": MASKSERVE_BF16,
    "onnxruntime": MASKSERVE_ORT,
    "openvino": MASKSERVE_OV,
    "openvino-bf16": MASKSERVE_OV_BF16,
    "openvino-int8": MASKSERVE_OV_INT8,
}
BACKEND_FLAGS: dict[str, tuple[str, ...]] = {
    "torch": (),
    "torch-bf16": ("--dtype", "bfloat16"),
    "onnxruntime": ("--backend", "onnxruntime"),
    "openvino": ("--backend", "openvino"),
    "openvino-bf16": ("--backend", "openvino", "--dtype", "bfloat16"),
    "openvino-int8": ("--backend", "openvino", "--quantize", "int8"),
}
# The module each entry needs installed.
BACKEND_NEEDS = {
    "onnxruntime": "onnxruntime",
    "openvino": "openvino",
    "openvino-bf16": "openvino",
    "openvino-int8": "nncf",
}
EXPORT_CACHE = CACHE_DIR / "maskserve-cache"
# Extra systems, on the default model only, each measured at EXTRA_CONCURRENCY: what tracing costs,
# and what a second worker gives. (name, extra flags, extra environment)
TRACED, TRACED_UNEXPORTED, WORKERS = (
    "maskserve, tracing to OTLP",
    "maskserve, tracing, no export",
    "maskserve, 2 workers",
)
# The OTLP endpoint is the benchmark's own sink (otlp_sink.py), filled in when it starts.
OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
EXTRAS: tuple[tuple[str, tuple[str, ...], dict[str, str]], ...] = (
    # What production runs: spans batched and sent as OTLP/HTTP protobuf, off the event loop.
    (TRACED, (), {"OTEL_TRACES_EXPORTER": "otlp", OTLP_ENDPOINT: ""}),
    # The spans alone: created, ended, dropped (no exporter).
    (TRACED_UNEXPORTED, ("--middleware", "default,+tracing"), {"OTEL_TRACES_EXPORTER": "none"}),
    (WORKERS, ("--workers", "2"), {}),
)
EXTRA_CONCURRENCY = 64


@dataclass(frozen=True)
class Plan:
    """How much of each measurement one model gets."""

    mix: int  # sentences in the mix; a multiple of 32 keeps the length distribution exact
    requests: dict[int, int]  # concurrency -> requests per measurement
    batch_sizes: tuple[int, ...]  # offline pipeline batch sizes tried
    rounds: int
    time_cap_s: float  # per measurement

    def requests_at(self, concurrency: int) -> int:
        return self.requests.get(concurrency, max(self.mix, 3 * concurrency))


# The bert-base shape runs at ~14 sentences/s here: few requests, or a round takes minutes.
QUICK = {
    "default": Plan(128, {8: 256, 64: 512}, (1, 8, 32, 64), 3, 90.0),
    "bert-base": Plan(32, {8: 48, 64: 128}, (1, 8, 32), 3, 90.0),
}
FULL = {
    "default": Plan(512, {8: 2048, 64: 4096}, (1, 8, 16, 32, 64), 5, 300.0),
    "bert-base": Plan(128, {8: 256, 64: 512}, (1, 8, 16, 32, 64), 5, 300.0),
}
MODELS: dict[str, Callable[[], BenchModel]] = {"default": default_model, "bert-base": bert_base_model}


@dataclass
class Round:
    """Everything one round measured for one model."""

    loads: dict[tuple[str, int], LoadResult] = field(default_factory=dict)
    offline: dict[tuple[bool, int], float] = field(default_factory=dict)  # (sorted, batch) -> sentences/s
    single_call_ms: list[float] = field(default_factory=list)
    interleaved: Interleaved | None = None

    def offline_best(self, *, sorted_: bool | None = None) -> float:
        return max(rate for (s, _), rate in self.offline.items() if sorted_ is None or s == sorted_)


@dataclass
class ModelRun:
    model: BenchModel
    plan: Plan
    mean_tokens: float
    systems: tuple[str, ...] = (MASKSERVE,)  # the maskserve systems measured, torch first
    extras: tuple[str, ...] = ()  # the extra systems (EXTRAS), measured at EXTRA_CONCURRENCY only
    # What the 2-worker server's /metrics said at the end: fill_mask requests per worker label.
    worker_requests: dict[str, float] = field(default_factory=dict)
    otlp_exports: tuple[int, int] = (0, 0)  # export requests and bytes the OTLP sink received
    rounds: list[Round] = field(default_factory=list)
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    rss_after_warmup: dict[str, int] = field(default_factory=dict)
    # The 1/5/15-minute load averages: other work on the machine skews every number.
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def publish(report: str, out: Path) -> None:
    """Write a Markdown report where the README's tables come from, and show it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report, encoding="utf-8")
    print(report)
    log(f"written to {out}")


def measure_server(
    server: Server,
    run: Round,
    sentences: Sequence[str],
    expected: Sequence[Expected],
    plan: Plan,
    concurrencies: Sequence[int],
) -> None:
    server.resume()
    try:
        for c in concurrencies:
            result = asyncio.run(
                run_load(
                    server.url,
                    sentences,
                    expected,
                    concurrency=c,
                    requests=plan.requests_at(c),
                    time_cap_s=plan.time_cap_s,
                )
            )
            run.loads[server.name, c] = result
            log(
                f"  {server.name:<12} c={c:<3} {result.rps:8.1f} req/s  p50 {result.p(50):8.1f} ms  "
                f"statuses {dict(result.statuses)}  wrong {result.wrong}"
            )
            if result.first_wrong:
                log(f"  WRONG ANSWER: {result.first_wrong}")
    finally:
        server.pause()


def offline_thread_counts() -> list[int]:
    """The offline limit gets its best thread count: all CPUs (no client competes) or one."""
    return sorted({1, available_cpus()})


def measure_offline(pipe: Any, run: Round, sentences: Sequence[str], plan: Plan) -> None:
    ordered = offline.by_length(pipe, sentences)
    for threads in offline_thread_counts():
        torch.set_num_threads(threads)
        for batch_size in plan.batch_sizes:
            for sorted_, mix in ((False, sentences), (True, ordered)):
                rate = offline.offline_rate(pipe, mix, batch_size=batch_size)
                run.offline[sorted_, batch_size] = max(rate, run.offline.get((sorted_, batch_size), 0.0))
        _, single_call_ms = offline.reference_answers(pipe, sentences)
        if not run.single_call_ms or percentile(single_call_ms, 50) < percentile(run.single_call_ms, 50):
            run.single_call_ms = single_call_ms
    torch.set_num_threads(available_cpus())
    log(
        f"  offline      plain best {run.offline_best(sorted_=False):8.1f}/s  sorted best "
        f"{run.offline_best(sorted_=True):8.1f}/s  single call p50 {percentile(run.single_call_ms, 50):.2f} ms"
    )


def warm_up(server: Server, sentences: Sequence[str], expected: Sequence[Expected], plan: Plan) -> None:
    n = min(len(sentences), 64)
    result = asyncio.run(
        run_load(server.url, sentences[:n], expected[:n], concurrency=8, requests=n, time_cap_s=plan.time_cap_s)
    )
    if result.correct != n:
        log(f"  warm-up of {server.name}: {result.correct}/{n} correct, {dict(result.statuses)}, {result.first_wrong}")


def maskserve_server(
    model: BenchModel,
    backend: str,
    log_dir: Path,
    *,
    name: str | None = None,
    flags: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Server:
    extra = [*BACKEND_FLAGS[backend], "--cache-dir", str(EXPORT_CACHE)]
    name = name or BACKEND_SYSTEMS[backend]
    port = free_port()
    log_path = log_dir / f"{name.replace(' ', '-').replace(',', '')}.log"
    return Server(name, maskserve_argv(model.path, port, *extra, *flags), port, log_path, env=env)


def measure_interleaved(
    servers: Sequence[Server], pipe: Any, run: Round, sentences: Sequence[str], expected: Sequence[Expected]
) -> None:
    """Concurrency 1, every sentence to each server in turn and to one offline call (interleaved.py)."""
    for server in servers:
        server.resume()
    try:
        result = run_interleaved({s.name: s.url for s in servers}, sentences, expected, lambda s: pipe(s, top_k=5))
    finally:
        for server in servers:
            server.pause()
    run.interleaved = result
    log(
        "  interleaved c=1 p50: "
        + ", ".join(f"{name} {result.p(name, 50):.2f} ms" for name in result.latencies_ms)
        + (f"  wrong {dict(result.wrong)}" if result.wrong else "")
        + (f"  failed {dict(result.failed)}" if result.failed else "")
    )


def worker_requests(server: Server) -> dict[str, float]:
    """fill_mask requests per ``worker`` label in one scrape of the server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    server.resume()
    try:
        with urllib.request.urlopen(server.url + "metrics", timeout=30) as response:
            text = response.read().decode()
    finally:
        server.pause()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "maskserve_requests_total" and sample.labels.get("route") == "fill_mask":
                worker = sample.labels.get("worker", "-")
                counts[worker] = counts.get(worker, 0.0) + sample.value
    return counts


def run_model(
    model: BenchModel,
    plan: Plan,
    concurrencies: Sequence[int],
    *,
    log_dir: Path = CACHE_DIR / "logs",
    backends: Sequence[str] = ("torch",),
    extras: bool = False,
) -> ModelRun:
    """Start the servers for ``model`` and measure ``plan.rounds`` rounds of every system."""
    log(f"model {model.name}: {model.path}")
    pipe = offline.load_pipeline(str(model.path))
    sentences = make_sentences(plan.mix)
    lengths = [len(ids) for ids in pipe.tokenizer(sentences)["input_ids"]]
    systems = tuple(BACKEND_SYSTEMS[b] for b in backends)
    extra_systems = EXTRAS if extras else ()
    result = ModelRun(
        model, plan, statistics.fmean(lengths), systems, tuple(e[0] for e in extra_systems), load_before=os.getloadavg()
    )
    expected, _ = offline.reference_answers(pipe, sentences)  # also warms the offline pipeline up
    offline.offline_rate(pipe, sentences, batch_size=8)
    seed = Server(SEED, seed_argv(model.path, port := free_port()), port, log_dir / "seed.log")
    with contextlib.ExitStack() as stack:
        stack.enter_context(seed)
        warm_up(seed, sentences, expected, plan)
        seed.pause()
        samplers: dict[str, RssSampler] = {}
        servers: list[Server] = []
        for backend in backends:
            # One at a time: the others are paused while it starts (an export takes the cores).
            server = stack.enter_context(maskserve_server(model, backend, log_dir))
            samplers[server.name] = RssSampler(server.pid, 1.0).start()
            warm_up(server, sentences, expected, plan)
            result.rss_after_warmup[server.name] = rss_bytes(server.pid)
            server.pause()
            servers.append(server)

        extra_servers: list[Server] = []
        sink = stack.enter_context(OtlpSink()) if extra_systems else None
        for name, flags, env in extra_systems:
            if OTLP_ENDPOINT in env and sink is not None:
                env = {**env, OTLP_ENDPOINT: sink.url}
            server = stack.enter_context(maskserve_server(model, "torch", log_dir, name=name, flags=flags, env=env))
            warm_up(server, sentences, expected, plan)
            server.pause()
            extra_servers.append(server)

        def measuring(server: Server, at: Sequence[int] = concurrencies) -> Callable[[Round], None]:
            return lambda r: measure_server(server, r, sentences, expected, plan, at)

        steps: list[Callable[[Round], None]] = [
            measuring(seed),
            *(measuring(server) for server in servers),
            *(measuring(server, [EXTRA_CONCURRENCY]) for server in extra_servers),
            lambda r: measure_offline(pipe, r, sentences, plan),
            lambda r: measure_interleaved([seed, *servers], pipe, r, sentences, expected),
        ]
        for i in range(plan.rounds):
            log(f"round {i + 1}/{plan.rounds}")
            round_ = Round()
            turn = i % len(steps)
            for step in steps[turn:] + steps[:turn]:  # take turns: drift hits each system alike
                step(round_)
            result.rounds.append(round_)
        result.rss = {name: sampler.stop() for name, sampler in samplers.items()}
        workers = [server for server in extra_servers if server.name == WORKERS]
        if workers:
            result.worker_requests = worker_requests(workers[0])
        if sink is not None:
            result.otlp_exports = (sink.exports, sink.bytes)
    result.load_after = os.getloadavg()
    return result


# -- the report ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    if len(values) < 2:
        return fmt.format(median(values))
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def ratio(values: Sequence[float]) -> str:
    return f"{median(values):.2f}×"


def _best_batch_size(run: ModelRun, *, sorted_: bool) -> int:
    def rate(batch_size: int) -> float:
        return median([r.offline[sorted_, batch_size] for r in run.rounds])

    return max(run.plan.batch_sizes, key=rate)


def load_averages(averages: Sequence[float]) -> str:
    """The 1/5/15-minute load averages, as every report prints them."""
    return "/".join(f"{a:.1f}" for a in averages)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ratio_table(run: ModelRun, concurrencies: Sequence[int]) -> list[str]:
    """Each maskserve system's req/s against the seed, the offline pipeline and maskserve on torch."""
    against_torch = MASKSERVE in run.systems and len(run.systems) > 1
    lines = [
        "| concurrency | system | / seed | / offline sorted | / offline best |"
        + (f" / {MASKSERVE} (torch) |" if against_torch else ""),
        "|---|---|---|---|---|" + ("---|" if against_torch else ""),
    ]
    for c in concurrencies:
        for system in run.systems:
            ms = [r.loads[system, c].rps for r in run.rounds]
            row = (
                f"| {c} | {system} | {ratio([m / r.loads[SEED, c].rps for m, r in zip(ms, run.rounds)])} | "
                f"{ratio([m / r.offline_best(sorted_=True) for m, r in zip(ms, run.rounds)])} | "
                f"{ratio([m / r.offline_best() for m, r in zip(ms, run.rounds)])} |"
            )
            if against_torch:
                row += f" {ratio([m / r.loads[MASKSERVE, c].rps for m, r in zip(ms, run.rounds)])} |"
            lines.append(row)
    return lines


def interleaved_section(run: ModelRun) -> list[str]:
    """Concurrency 1, interleaved: p50/p90 per system and paired differences, all rounds pooled."""
    passes = [r.interleaved for r in run.rounds if r.interleaved is not None]
    if not passes:
        return []
    systems = list(passes[0].latencies_ms)
    pooled = Interleaved({name: [ms for p in passes for ms in p.latencies_ms[name]] for name in systems})
    for p in passes:
        pooled.wrong.update(p.wrong)
        pooled.failed.update(p.failed)
    lines = [
        "",
        f"Concurrency 1, interleaved: each of the {len(passes[0].latencies_ms[systems[0]])} sentences sent to "
        f"every system in turn (the order rotating), {len(passes)} rounds pooled; a paired difference is the "
        "median over sentences of this system's latency minus the other's on the same sentence.",
        "",
        f"| system | p50 ms | p90 ms | − {SEED}, paired | − {OFFLINE}, paired | wrong / failed |",
        "|---|---|---|---|---|---|",
    ]
    for name in systems:
        against_seed = f"{pooled.paired(name, SEED):+.2f} ms" if name != SEED else "–"
        against_offline = f"{pooled.paired(name, OFFLINE):+.2f} ms" if name != OFFLINE else "–"
        lines.append(
            f"| {name} | {pooled.p(name, 50):.2f} | {pooled.p(name, 90):.2f} | {against_seed} | {against_offline} | "
            f"{pooled.wrong[name]} / {pooled.failed[name]} |"
        )
    others = [name for name in systems if name in BACKEND_SYSTEMS.values() and name != MASKSERVE]
    if MASKSERVE in systems and others:
        lines.append("")
    for other in others if MASKSERVE in systems else ():
        per_round = [p.p(other, 50) / p.p(MASKSERVE, 50) for p in passes]
        lines.append(
            f"Concurrency 1 (interleaved): {other} p50 / {MASKSERVE} (torch) p50 = {ratio(per_round)} "
            f"(median of per-round ratios, {', '.join(f'{x:.2f}' for x in per_round)}; lower is faster)."
        )
    return lines


def matrix_units_section(run: ModelRun) -> list[str]:
    """The issue's targets for the CPU's matrix units, as ratios inside each round.

    openvino float32 against onnxruntime applies on every CPU; the bfloat16 targets were set for
    a CPU with AMX, and on any other the figures are given for what they are, not held to them.
    """
    passes = [r.interleaved for r in run.rounds if r.interleaved is not None]
    c_high = max((c for (_, c) in run.rounds[0].loads), default=0) if run.rounds else 0
    lines: list[str] = []

    def c1_ratio(system: str, other: str) -> str:
        return ratio([p.p(system, 50) / p.p(other, 50) for p in passes]) if passes else "not measured"

    def rps_ratio(system: str, other: str) -> str:
        return ratio([r.loads[system, c_high].rps / r.loads[other, c_high].rps for r in run.rounds])

    if MASKSERVE_OV in run.systems and MASKSERVE_ORT in run.systems:
        lines += [
            f"- {MASKSERVE_OV} / {MASKSERVE_ORT}: req/s at c={c_high} {rps_ratio(MASKSERVE_OV, MASKSERVE_ORT)} "
            f"(target ≥ 1); p50 at c=1, interleaved {c1_ratio(MASKSERVE_OV, MASKSERVE_ORT)} (target ≤ 1, "
            "lower is faster)",
        ]
    bf16 = [s for s in (MASKSERVE_BF16, MASKSERVE_OV_BF16) if s in run.systems]
    if bf16 and MASKSERVE in run.systems:
        fastest = max(bf16, key=lambda s: median([r.loads[s, c_high].rps for r in run.rounds]))
        amx = "amx_bf16" in matrix_features()
        held = "target" if amx else "an AMX target, not held here"
        lines += [
            f"- fastest bfloat16 at c={c_high}: {fastest}, {rps_ratio(fastest, MASKSERVE)} the req/s of "
            f"{MASKSERVE} (torch float32) ({held}: ≥ 3×); "
            + ratio([r.loads[fastest, c_high].rps / r.offline_best(sorted_=True) for r in run.rounds])
            + " the offline torch float32 pipeline's length-sorted best",
            f"- {fastest} p50 at c=1, interleaved: {c1_ratio(fastest, MASKSERVE)} {MASKSERVE}'s ({held}: ≤ 0.35×)",
        ]
        if not amx:
            lines.append(
                f"- this CPU has no AMX ({describe_features()}): the bfloat16 figures above are "
                f"{precision_in_effect('bfloat16', 'cpu')} figures, and the AMX targets were not measured"
            )
    if MASKSERVE_OV_INT8 in run.systems and MASKSERVE in run.systems:
        lines.append(
            f"- {MASKSERVE_OV_INT8} ({int8_in_effect()}): {rps_ratio(MASKSERVE_OV_INT8, MASKSERVE)} the req/s "
            f"of {MASKSERVE} (torch float32) at c={c_high}; p50 at c=1, interleaved "
            f"{c1_ratio(MASKSERVE_OV_INT8, MASKSERVE)} (its agreement with float32: benchmarks/agreement.py)"
        )
    return ["", "Matrix units (ratios are medians of per-round ratios):", "", *lines] if lines else []


def extras_section(run: ModelRun) -> list[str]:
    """What tracing costs and what a second worker gives, at EXTRA_CONCURRENCY, paired per round."""
    c, lines = EXTRA_CONCURRENCY, []
    if not all((MASKSERVE, c) in r.loads for r in run.rounds):
        return lines  # nothing to compare with: maskserve on torch was not measured at c
    for system, how in (
        (TRACED, "every span batched and sent as OTLP/HTTP protobuf to a local sink"),
        (TRACED_UNEXPORTED, "spans created and dropped, no exporter"),
    ):
        if system in run.extras:
            rates = [r.loads[system, c].rps / r.loads[MASKSERVE, c].rps for r in run.rounds]
            p50 = [r.loads[system, c].p(50) - r.loads[MASKSERVE, c].p(50) for r in run.rounds]
            lines += [
                "",
                f"Tracing ({how}) at c={c}: {ratio(rates)} the req/s of tracing off, p50 {median(p50):+.1f} ms "
                "(medians of per-round figures).",
            ]
    if TRACED in run.extras:
        exports, size = run.otlp_exports
        lines.append(f"The OTLP sink received {exports} exports, {size / 1e6:.1f} MB in all.")
    if WORKERS in run.extras:
        rates = [r.loads[WORKERS, c].rps / r.loads[MASKSERVE, c].rps for r in run.rounds]
        counts = ", ".join(f'worker="{w}": {n:.0f}' for w, n in sorted(run.worker_requests.items()))
        lines += [
            "",
            f"--workers 2 at c={c}: {ratio(rates)} the req/s of one worker (median of per-round ratios; "
            f"{available_cpus()} CPUs, one torch thread per worker). Its /metrics at the end, one scrape, "
            f'maskserve_requests_total{{route="fill_mask"}} by worker: {counts}.',
        ]
    return lines


def render(runs: Sequence[ModelRun], concurrencies: Sequence[int], command: str, mode: str) -> str:
    lines = [
        "# Benchmark: maskserve vs the seed design vs the offline pipeline",
        "",
        f"- command: `{command}` ({mode})",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {cpu_model()}, nproc {available_cpus()} (os.cpu_count {os.cpu_count()}), "
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}",
        f"- CPU matrix features: {describe_features()} (bfloat16 here: {precision_in_effect('bfloat16', 'cpu')}; "
        f"{int8_in_effect()})"
        + (
            f"; every process's kernels held to `ONEDNN_MAX_CPU_ISA={isa_cap_in_effect()}` on a CPU with more"
            if isa_cap_in_effect()
            else ""
        ),
        f"- torch threads: the offline pipeline gets the best of {offline_thread_counts()} (no client competes "
        f"with it); the seed design keeps torch's default ({available_cpus()}); maskserve its own default "
        f"(up to {available_cpus()}, one for a narrow model's small batches); maskserve onnxruntime "
        f"{available_cpus()} ONNX Runtime threads that sleep when idle; maskserve openvino {available_cpus()} "
        "OpenVINO threads, one stream",
        "- req/s: correct answers per second, median of the rounds (min–max); ratios are medians of "
        "per-round ratios. Latencies pool all rounds. Offline = `pipeline(sentences, batch_size=b)` "
        "in-process, best b of the round.",
        "",
    ]
    for run in runs:
        plan = run.plan
        lines += [
            f"## {run.model.name}",
            "",
            f"{plan.mix} sentences, {run.mean_tokens:.1f} tokens on average, one mask each; "
            f"{plan.rounds} rounds; requests per measurement: "
            + ", ".join(f"c={c}: {plan.requests_at(c)}" for c in concurrencies)
            + f"; offline batch sizes {', '.join(map(str, plan.batch_sizes))}. Load average "
            f"(1/5/15 min) {load_averages(run.load_before)} before, {load_averages(run.load_after)} after.",
            "",
            "| concurrency | system | req/s | p50 ms | p90 ms | p99 ms | statuses | wrong answers |",
            "|---|---|---|---|---|---|---|---|",
        ]
        rows = [(c, system) for c in concurrencies for system in (SEED, *run.systems)]
        rows += [(EXTRA_CONCURRENCY, system) for system in run.extras]
        for c, system in rows:
            results = [r.loads[system, c] for r in run.rounds]
            latencies = [ms for r in results for ms in r.latencies_ms]
            statuses: Counter[str] = sum((r.statuses for r in results), Counter())
            capped = " (time cap hit)" if any(r.capped for r in results) else ""
            lines.append(
                f"| {c} | {system} | {spread([r.rps for r in results])}{capped} | "
                f"{percentile(latencies, 50):.1f} | {percentile(latencies, 90):.1f} | "
                f"{percentile(latencies, 99):.1f} | "
                + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
                + f" | {sum(r.wrong for r in results)} |"
            )
        best_b = {s: _best_batch_size(run, sorted_=s) for s in (False, True)}
        offline_rows = [
            ("offline pipeline, plain order", [r.offline_best(sorted_=False) for r in run.rounds], best_b[False]),
            ("offline pipeline, length-sorted", [r.offline_best(sorted_=True) for r in run.rounds], best_b[True]),
        ]
        lines += ["", "| offline (no server) | sentences/s | best batch size |", "|---|---|---|"]
        lines += [f"| {name} | {spread(rates)} | {b} |" for name, rates, b in offline_rows]
        lines += ["", *ratio_table(run, concurrencies)]
        lines += interleaved_section(run)
        lines += matrix_units_section(run)
        lines += extras_section(run)
        if 1 in concurrencies:
            single = [percentile(r.single_call_ms, 50) for r in run.rounds]
            lines.append("")
            for system in run.systems:
                c1 = [r.loads[system, 1].p(50) for r in run.rounds]
                lines.append(
                    f"Concurrency 1: {system} p50 {median(c1):.2f} ms over HTTP vs one offline pipeline call "
                    f"p50 {median(single):.2f} ms on the same mix: "
                    f"{median([a - b for a, b in zip(c1, single)]):+.2f} ms (median of per-round differences)."
                )
            for other in (s for s in run.systems if s != MASKSERVE) if MASKSERVE in run.systems else ():
                p50s = [r.loads[other, 1].p(50) / r.loads[MASKSERVE, 1].p(50) for r in run.rounds]
                lines.append(
                    f"Concurrency 1: {other} p50 / {MASKSERVE} (torch) p50: {ratio(p50s)} "
                    "(median of per-round ratios; lower is faster)."
                )
        mib = 1024 * 1024
        for system, samples in run.rss.items():
            if not samples:
                continue
            values, warm = [b for _, b in samples], run.rss_after_warmup[system]
            lines += [
                "",
                f"{system} resident memory (VmRSS, sampled every 1 s over {samples[-1][0]:.0f} s): "
                f"{values[0] / mib:.0f} MiB at start, {warm / mib:.0f} MiB after warm-up, "
                f"max {max(values) / mib:.0f} MiB, {values[-1] / mib:.0f} MiB at the end "
                f"({(values[-1] - warm) / warm:+.1%} since warm-up).",
            ]
        lines.append("")
    return "\n".join(lines)


def installed(backend: str) -> bool:
    needs = BACKEND_NEEDS.get(backend)
    return needs is None or importlib.util.find_spec(needs) is not None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds (~10 minutes on 2 cores)")
    parser.add_argument("--models", default="default,bert-base", help="comma-separated: default, bert-base")
    parser.add_argument(
        "--concurrency",
        default="8,64",
        help="comma-separated client counts of the closed loops (concurrency 1 is measured interleaved)",
    )
    parser.add_argument(
        "--backends",
        default=",".join(b for b in BACKEND_SYSTEMS if installed(b)),
        help=f"maskserve's backends and precisions to measure, comma-separated: {', '.join(BACKEND_SYSTEMS)} "
        "(default: every one whose runtime is installed)",
    )
    parser.add_argument(
        "--extras",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"on the default model, also measure {TRACED!r} and {WORKERS!r} at c={EXTRA_CONCURRENCY}",
    )
    parser.add_argument("--rounds", type=int, default=0, help="override the plan's round count")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the Markdown table goes")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(available_cpus())  # as maskserve does: the CPUs this process may use
    plans = QUICK if args.quick else FULL
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or [b for b in backends if b not in BACKEND_SYSTEMS]:
        raise SystemExit(f"--backends: choose from {list(BACKEND_SYSTEMS)}")
    missing = [b for b in backends if not installed(b)]
    if missing:
        raise SystemExit(f"--backends {','.join(missing)}: pip install 'maskserve[onnx,openvino]' first")
    runs = []
    for key in keys:
        plan = plans[key]
        if args.rounds:
            plan = Plan(plan.mix, plan.requests, plan.batch_sizes, args.rounds, plan.time_cap_s)
        runs.append(
            run_model(
                MODELS[key](),
                plan,
                concurrencies,
                log_dir=CACHE_DIR / "logs" / key,
                backends=backends,
                extras=args.extras and key == "default",
            )
        )
    command = "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv)
    report = render(runs, concurrencies, command.strip(), "quick" if args.quick else "full")
    publish(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
