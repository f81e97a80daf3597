"""A model loaded and unloaded while serving: the server's resident memory at each step, and another
model's latency while a load runs.

    python -m benchmarks.repository --out benchmarks/results/repository.md    # about 4 minutes on 2 cores
    python -m benchmarks.repository --requests 16 --quiet 1 --idle 1 --window 1 --big-model PATH  # a smoke run

One maskserve subprocess serves a model repository assembled in a temporary folder: the default
model as ``small`` and a random model of bert-base's shape as ``bert-base``, under
``--model-control-mode explicit --model small``. Phases, VmRSS of the server read at each: warm-up
of ``small``, right after and after a quiet spell longer than the idle trim's delay; the load of
``bert-base`` (timed); ``--requests`` requests to it; its unload, right after and after a quiet
spell; bursts of the largest answers the limits admit on ``small``, then ``--idle`` seconds idle.
Last, ``small``'s latency at c=4 for ``--window`` seconds with nothing loading, then for as long
again while ``bert-base`` is loaded and unloaded in a loop. Every answer is checked against the
pipeline's. The report starts with the CPU, its flags and the load averages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from maskserve.config.cpus import available_cpus
from maskserve.config.settings import Settings
from maskserve.engine.cpu import cpu_flags, describe_features

from . import offline
from .load import Expected, LoadResult, percentile, run_load
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .run import cpu_model, load_averages
from .sentences import make_sentences
from .servers import RssSampler, Server, free_port

MIB = 1024 * 1024
RESULTS = Path(__file__).resolve().parent / "results" / "repository.md"
# Only the benchmark and its server know it; passed through the environment, as the flag's help
# advises, so that it does not show in the process list.
CONTROL_KEY = "repository-benchmark-control-key"
SMALL, BIG = "small", "bert-base"
# Longer than the idle trim's delay plus one look (memory.IDLE_TRIM_DELAY_S, IDLE_POLL_S): the
# idle readings are the ones the server settles at.
QUIET_S = 15.0
# Shorter than the idle trim's delay: the bursts are one spell of traffic.
BURST_PAUSE_S = 2.0
# The targets.
UNLOAD_TARGET_BYTES = 50 * 10**6
IDLE_TARGET_BYTES = 60 * 10**6
P50_TARGET_RATIO = 2.0
# Distinct sentences per model: enough that the mix is not one cached shape, few enough that the
# offline references take seconds.
MIX = 64


@dataclass(frozen=True)
class Memory:
    """One reading of the server's memory, in bytes."""

    rss: int
    anon: int
    file: int

    @classmethod
    def of(cls, pid: int) -> Memory:
        """VmRSS, and how much of it is anonymous (the heap) or file-backed (mapped weights, libraries)."""
        fields = {}
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    fields[key] = int(value.split()[0]) * 1024
        return cls(fields["VmRSS"], fields.get("RssAnon", 0), fields.get("RssFile", 0))


@dataclass
class Report:
    """Every reading of one run, in the order taken."""

    readings: list[tuple[str, Memory]] = field(default_factory=list)
    load_s: float = 0.0
    unload_s: float = 0.0
    serve: LoadResult | None = None
    serve_peak: int = 0
    bursts_s: float = 0.0
    burst_statuses: dict[int, int] = field(default_factory=dict)
    bursts_peak: int = 0
    idle_samples: list[tuple[float, int]] = field(default_factory=list)
    quiet: LoadResult | None = None
    loading: LoadResult | None = None
    loads: list[tuple[float, float]] = field(default_factory=list)  # each load's (start, end), loop time
    load_failures: list[str] = field(default_factory=list)
    loading_covered: float = 0.0  # share of the window with a load in progress

    def read(self, pid: int, phase: str) -> Memory:
        memory = Memory.of(pid)
        self.readings.append((phase, memory))
        print(f"{phase}: {memory.rss / MIB:.0f} MiB", flush=True)
        return memory

    def at(self, phase: str) -> Memory:
        return dict(self.readings)[phase]


def assemble_repository(root: Path, models: dict[str, Path]) -> Path:
    """A model repository in ``root``: a real folder per model, its files linked from the model's
    own folder (a linked folder would resolve outside the repository, which maskserve refuses)."""
    for name, source in models.items():
        folder = root / name
        folder.mkdir(parents=True)
        for item in source.resolve().iterdir():
            if item.is_file():
                (folder / item.name).symlink_to(item)
    return root


def large_bodies(count: int, settings: Settings) -> list[bytes]:
    """``count`` requests of the largest answers the limits admit: --max-inputs texts, one mask each,
    and the top_k that brings them to --max-predictions."""
    texts = make_sentences(1024)
    top_k = min(settings.max_top_k, settings.max_predictions // settings.max_inputs)
    return [
        json.dumps(
            {
                "inputs": [texts[(i * 7 + j) % len(texts)] for j in range(settings.max_inputs)],
                "parameters": {"top_k": top_k},
            }
        ).encode()
        for i in range(count)
    ]


async def post_all(url: str, bodies: Sequence[bytes], concurrency: int, statuses: dict[int, int]) -> None:
    """Send every body from ``concurrency`` clients, each as soon as its previous answer is read."""
    queue = list(reversed(bodies))
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def client() -> None:
            while queue:
                async with session.post(url, data=queue.pop(), headers=headers) as response:
                    await response.read()
                    statuses[response.status] = statuses.get(response.status, 0) + 1

        await asyncio.gather(*(client() for _ in range(concurrency)))


async def control(session: aiohttp.ClientSession, base: str, name: str, action: str) -> float:
    """Load or unload ``name``; its duration in seconds. Raises on any answer but 200."""
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {CONTROL_KEY}"}
    async with session.post(f"{base}v2/repository/models/{name}/{action}", headers=headers) as response:
        body = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{action} of {name!r}: {response.status} {body[:200]!r}")
    return time.perf_counter() - started


async def one_change(base: str, name: str, action: str) -> float:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        return await control(session, base, name, action)


async def latency_while_loading(
    base: str, refs: tuple[list[str], list[Expected]], window_s: float, report: Report
) -> LoadResult:
    """``small`` at c=4 for ``window_s`` while ``bert-base`` is loaded and unloaded back to back."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    async def churn() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            while not stop.is_set():
                started = loop.time()
                try:
                    await control(session, base, BIG, "load")
                    report.loads.append((started, loop.time()))
                    await control(session, base, BIG, "unload")
                except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                    report.load_failures.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.5)  # a failing load must not spin

    churner = asyncio.create_task(churn())
    # The first load's file reads and allocations start at once; the window starts with it.
    begun = loop.time()
    result = await run_load(f"{base}models/{SMALL}", *refs, concurrency=4, requests=10**6, time_cap_s=window_s)
    ended = loop.time()
    stop.set()
    await churner  # the load in flight finishes and is unloaded: the next phase starts clean
    covered = sum(max(0.0, min(end, ended) - max(start, begun)) for start, end in report.loads)
    report.loading_covered = covered / (ended - begun)
    return result


def references(model: Path) -> tuple[list[str], list[Expected]]:
    sentences = make_sentences(MIX)
    expected, _ = offline.reference_answers(offline.load_pipeline(str(model)), sentences)
    return sentences, expected


def measure(small: BenchModel, big: BenchModel, args: argparse.Namespace, log_dir: Path) -> Report:
    settings = Settings()
    small_refs, big_refs = references(small.path), references(big.path)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="maskserve-repository-") as tmp:
        repository = assemble_repository(Path(tmp), {SMALL: small.path, BIG: big.path})
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "maskserve",
            "--model-repository",
            str(repository),
            "--model-control-mode",
            "explicit",
            "--model",
            SMALL,
            "--port",
            str(port),
        ]
        env = {"MASKSERVE_CONTROL_KEY": CONTROL_KEY}
        with Server("maskserve", argv, port, log_dir / "repository.log", env=env) as server:
            pid, base = server.pid, server.url
            small_url, big_url = f"{base}models/{SMALL}", f"{base}models/{BIG}"
            warm = asyncio.run(run_load(small_url, *small_refs, concurrency=4, requests=MIX, time_cap_s=120))
            check(warm, "warm-up")
            report.read(pid, "small warm")
            time.sleep(args.quiet)
            report.read(pid, "small idle")

            report.load_s = asyncio.run(one_change(base, BIG, "load"))
            report.read(pid, "bert-base loaded")
            sampler = RssSampler(pid, 0.5).start()
            report.serve = asyncio.run(
                run_load(big_url, *big_refs, concurrency=args.concurrency, requests=args.requests, time_cap_s=900)
            )
            report.serve_peak = max(b for _, b in sampler.stop())
            report.read(pid, "bert-base served")
            report.unload_s = asyncio.run(one_change(base, BIG, "unload"))
            report.read(pid, "unloaded")
            time.sleep(min(5.0, args.quiet))
            report.read(pid, "unloaded +5 s")
            time.sleep(max(0.0, args.quiet - 5.0))
            report.read(pid, "unloaded, idle")

            bodies = large_bodies(args.per_burst, settings)
            sampler = RssSampler(pid, 0.5).start()
            started = time.monotonic()
            for burst in range(args.bursts):
                if burst:
                    time.sleep(BURST_PAUSE_S)
                asyncio.run(post_all(small_url, bodies, args.concurrency, report.burst_statuses))
            report.bursts_s = time.monotonic() - started
            report.bursts_peak = max(b for _, b in sampler.stop())
            report.read(pid, "after bursts")
            sampler = RssSampler(pid, 5.0).start()
            time.sleep(args.idle + 0.5)  # the last sample lands at --idle
            report.idle_samples = sampler.stop()
            report.read(pid, "bursts, idle")

            report.quiet = asyncio.run(
                run_load(small_url, *small_refs, concurrency=4, requests=10**6, time_cap_s=args.window)
            )
            report.loading = asyncio.run(latency_while_loading(base, small_refs, args.window, report))
            report.read(pid, "end")
    return report


def check(result: LoadResult, phase: str) -> None:
    if result.failed:
        raise SystemExit(f"{phase}: {result.failed} of {result.sent} failed: {result.failures[:3]}")


def verdicts(report: Report) -> list[tuple[str, bool, str]]:
    """Each target: its statement, whether met, the figures it was judged on."""
    before = report.at("small idle").rss
    unloaded = report.at("unloaded, idle").rss
    right_after = report.at("unloaded").rss
    after_idle = report.at("bursts, idle").rss
    quiet, loading = report.quiet, report.loading
    assert quiet is not None and loading is not None
    ratio = loading.p(50) / quiet.p(50)
    failed = loading.failed + len(report.load_failures)
    return [
        (
            f"after an unload, RSS within {UNLOAD_TARGET_BYTES // 10**6} MB of before the load",
            unloaded - before <= UNLOAD_TARGET_BYTES,
            f"{(unloaded - before) / 10**6:+.0f} MB after the quiet spell ({(right_after - before) / 10**6:+.0f} MB "
            "right after the unload)",
        ),
        (
            f"after bursts and idle, RSS within {IDLE_TARGET_BYTES // 10**6} MB of the idle RSS after warm-up",
            after_idle - before <= IDLE_TARGET_BYTES,
            f"{(after_idle - before) / 10**6:+.0f} MB against the idle after warm-up; "
            f"{(after_idle - report.at('unloaded, idle').rss) / 10**6:+.0f} MB against the idle before the bursts",
        ),
        (
            f"while a model loads, the other's p50 at c=4 at most {P50_TARGET_RATIO:g}x, no request failing",
            ratio <= P50_TARGET_RATIO and failed == 0,
            f"p50 {loading.p(50):.1f} ms against {quiet.p(50):.1f} ms ({ratio:.2f}x); {loading.failed} of "
            f"{loading.sent} requests failed, {len(report.load_failures)} loads or unloads failed",
        ),
    ]


def render(report: Report, args: argparse.Namespace, command: str, small: BenchModel, big: BenchModel) -> str:
    settings = Settings()
    top_k = min(settings.max_top_k, settings.max_predictions // settings.max_inputs)
    simd = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx_vnni", "avx2")))
    serve, quiet, loading = report.serve, report.quiet, report.loading
    assert serve is not None and quiet is not None and loading is not None
    lines = [
        "# A model loaded and unloaded while serving",
        "",
        f"`{command}`",
        "",
        f"- machine: {cpu_model()}, nproc {available_cpus()} (os.cpu_count {os.cpu_count()}); CPU matrix "
        f"features: {describe_features()}; flags: {', '.join(simd) or 'none'}",
        f"- load averages (1/5/15 min): before {load_averages(args.load_before)}, after "
        f"{load_averages(os.getloadavg())}",
        f"- one maskserve, `--model-repository` of `{SMALL}` ({small.name}) and `{BIG}` ({big.name}), "
        f"`--model-control-mode explicit --model {SMALL}`, otherwise its defaults; Python {sys.version.split()[0]}",
        f"- quiet spells: {args.quiet:g} s ({'past' if args.quiet > QUIET_S - 1 else 'short of'} the idle trim's "
        f"delay and one look); bursts: {args.bursts} x {args.per_burst} "
        f"requests of {settings.max_inputs} texts x top_k {top_k}, c={args.concurrency}, then {args.idle:g} s idle",
        "",
        "RSS is the server's VmRSS; anonymous and file-backed are its RssAnon and RssFile. MiB.",
        "",
        "| phase | RSS | anonymous | file-backed | change from the one before |",
        "|---|---|---|---|---|",
    ]
    previous = None
    for phase, memory in report.readings:
        change = "" if previous is None else f"{(memory.rss - previous) / MIB:+.0f}"
        lines.append(
            f"| {phase} | {memory.rss / MIB:.0f} | {memory.anon / MIB:.0f} | {memory.file / MIB:.0f} | {change} |"
        )
        previous = memory.rss
    curve = ", ".join(f"{t:.0f}: {b / MIB:.0f}" for t, b in report.idle_samples)
    lines += [
        "",
        f"- load of `{BIG}`: {report.load_s:.2f} s (the route answers once it serves); unload {report.unload_s:.2f} s",
        f"- `{BIG}` served {serve.sent} requests at c={args.concurrency}: {serve.rps:.1f} answers/s, p50 "
        f"{serve.p(50):.0f} ms, {serve.failed} failed; peak RSS while serving {report.serve_peak / MIB:.0f} MiB",
        f"- bursts: {report.bursts_s:.1f} s, statuses {dict(sorted(report.burst_statuses.items()))}; peak RSS "
        f"{report.bursts_peak / MIB:.0f} MiB; idle after them (s: MiB): {curve}",
        "",
        f"`{SMALL}` at c=4, {args.window:g} s each:",
        "",
        "| while | requests | answers/s | p50 ms | p95 ms | p99 ms | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, result in (("nothing loads", quiet), (f"`{BIG}` loads and unloads in a loop", loading)):
        lines.append(
            f"| {label} | {result.sent} | {result.rps:.1f} | {result.p(50):.1f} | {result.p(95):.1f} | "
            f"{percentile(result.latencies_ms, 99):.1f} | {result.failed} |"
        )
    loads = [end - start for start, end in report.loads]
    first_failure = f": {report.load_failures[0]}" if report.load_failures else ""
    lines += [
        "",
        f"- during the loading window: {len(loads)} loads of `{BIG}` (each {min(loads, default=0):.1f}-"
        f"{max(loads, default=0):.1f} s), a load in progress {report.loading_covered:.0%} of the window; "
        f"{len(report.load_failures)} loads or unloads failed{first_failure}",
        "",
        *verdict_table(verdicts(report)),
    ]
    return "\n".join(lines) + "\n"


def verdict_table(verdicts: Sequence[tuple[str, bool, str]]) -> list[str]:
    """The report's last table: each target, whether it was met, and the figures it was judged on."""
    return [
        "| target | met | measured |",
        "|---|---|---|",
        *(f"| {target} | {'yes' if met else 'no'} | {figures} |" for target, met, figures in verdicts),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.repository", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests to the loaded model")
    parser.add_argument("--concurrency", type=int, default=8, help="clients serving it and sending the bursts")
    parser.add_argument("--quiet", type=float, default=QUIET_S, help="seconds of each quiet spell before a reading")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--per-burst", type=int, default=40, help="requests in each burst of large answers")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds idle after the bursts")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of each latency window")
    parser.add_argument(
        "--big-model", type=Path, default=None, help="the model loaded and unloaded (default: bert-base's shape)"
    )
    parser.add_argument("--out", type=Path, default=None, help=f"write the report here too (e.g. {RESULTS})")
    raw = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(raw)
    args.load_before = os.getloadavg()
    small = default_model()
    big = BenchModel(str(args.big_model), args.big_model) if args.big_model else bert_base_model()
    report = measure(small, big, args, CACHE_DIR / "logs")
    command = "python -m benchmarks.repository " + shlex.join(raw)
    text = render(report, args, command.strip(), small, big)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    serve = report.serve
    failed = (serve.failed if serve else 0) + sum(n for s, n in report.burst_statuses.items() if s != 200)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
