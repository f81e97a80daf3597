"""Does maskserve give memory back after bursts of large answers? glibc, glibc with the idle trim,
jemalloc, side by side in one run.

    python -m benchmarks.memory_return --jemalloc /path/to/libjemalloc.so.2
    python -m benchmarks.memory_return --variants glibc,idle-trim --bursts 2

Each variant is a fresh maskserve subprocess on the default model. Phases: a warm-up of small
requests, then a quiet spell, after which its idle RSS is read; then bursts of the largest answers
the limits admit (--max-inputs texts x top_k = --max-predictions) from a closed loop of clients;
then VmRSS right after and every few seconds through a 30 s idle spell.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from maskserve.config.cpus import available_cpus
from maskserve.config.settings import Settings
from maskserve.engine.cpu import describe_features

from .load import percentile
from .models import CACHE_DIR, default_model
from .run import cpu_model, load_averages
from .sentences import make_sentences
from .servers import RssSampler, Server, free_port, maskserve_argv, rss_bytes

MIB = 1024 * 1024
RESULTS = Path(__file__).parent / "results" / "memory_return.md"
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0"
# Longer than the idle trim's delay plus one look (memory.IDLE_TRIM_DELAY_S, IDLE_POLL_S), so the
# idle reading after warm-up is the one each variant settles at.
QUIET_S = 15.0
# The target: RSS after this much idle within 60 MB of the idle RSS after warm-up.
IDLE_AFTER_S = 30.0
TARGET_BYTES = 60 * 10**6
# Shorter than the idle trim's delay: the bursts are one spell of traffic.
BURST_PAUSE_S = 2.0


@dataclass(frozen=True)
class Variant:
    name: str
    module: str  # what ``python -m`` runs
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class VariantRun:
    variant: Variant
    after_start: int = 0
    idle: int = 0
    after_bursts: int = 0
    idle_samples: list[tuple[float, int]] = field(default_factory=list)
    peak: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    burst_s: float = 0.0
    allocator: str = ""

    @property
    def after_idle(self) -> int:
        return self.idle_samples[-1][1]

    def row(self) -> str:
        kept = self.after_idle - self.idle
        rps = len(self.latencies_ms) / self.burst_s if self.burst_s else 0.0
        return (
            f"| {self.variant.name} | {self.allocator} | {self.after_start / MIB:.0f} | {self.idle / MIB:.0f} | "
            f"{self.peak / MIB:.0f} | {self.after_bursts / MIB:.0f} | {self.after_idle / MIB:.0f} | "
            f"{kept / MIB:+.0f} | {'yes' if kept <= TARGET_BYTES else 'no'} | {rps:.1f} | "
            f"{percentile(self.latencies_ms, 50):.0f} | {percentile(self.latencies_ms, 95):.0f} | "
            f"{dict(sorted(self.statuses.items()))} |"
        )

    def curve(self) -> str:
        points = ", ".join(f"{t:.0f}: {b / MIB:.0f}" for t, b in self.idle_samples)
        return f"- {self.variant.name}, idle after the bursts (s: MiB): {points}"


def variants(names: Sequence[str], jemalloc: Path | None, jemalloc_conf: str) -> list[Variant]:
    known = {
        "glibc": Variant("glibc", "benchmarks.no_idle_trim_server"),
        "idle-trim": Variant("idle-trim", "maskserve"),
        "jemalloc": Variant(
            "jemalloc", "maskserve", {"LD_PRELOAD": str(jemalloc), "MALLOC_CONF": jemalloc_conf} if jemalloc else {}
        ),
    }
    chosen = []
    for name in names:
        if name not in known:
            raise SystemExit(f"unknown variant {name!r}: choose from {', '.join(known)}")
        if name == "jemalloc" and jemalloc is None:
            raise SystemExit("the jemalloc variant needs --jemalloc PATH (libjemalloc.so.2)")
        chosen.append(known[name])
    return chosen


def allocator_of(pid: int) -> str:
    """Which malloc the server really runs on: a preload that failed would measure glibc twice."""
    with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
        return "jemalloc" if "libjemalloc" in f.read() else "glibc"


async def post_all(url: str, bodies: Sequence[bytes], concurrency: int, run: VariantRun) -> None:
    """Send every body from ``concurrency`` clients, each as soon as its previous answer is read."""
    queue = list(reversed(bodies))
    timeout = aiohttp.ClientTimeout(total=120)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            while queue:
                body = queue.pop()
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    run.statuses[response.status] = run.statuses.get(response.status, 0) + 1
                run.latencies_ms.append((time.perf_counter() - started) * 1000)

        await asyncio.gather(*(client() for _ in range(concurrency)))


def measure(
    variant: Variant, model: Path, *, bursts: int, per_burst: int, concurrency: int, log_dir: Path
) -> VariantRun:
    settings = Settings()
    texts = make_sentences(1024)
    top_k = settings.max_predictions // settings.max_inputs  # one mask a text: the most answers admitted
    large = [
        json.dumps(
            {
                "inputs": [texts[(i * 7 + j) % len(texts)] for j in range(settings.max_inputs)],
                "parameters": {"top_k": top_k},
            }
        ).encode()
        for i in range(per_burst)
    ]
    small = [json.dumps({"inputs": text}).encode() for text in texts[:64]]
    run = VariantRun(variant)
    port = free_port()
    argv = maskserve_argv(model, port)
    argv[1:3] = ["-m", variant.module]
    with Server(variant.name, argv, port, log_dir / f"memory-return-{variant.name}.log", env=variant.env) as server:
        run.allocator = allocator_of(server.pid)
        run.after_start = rss_bytes(server.pid)
        asyncio.run(post_all(server.url, small, concurrency, run))
        time.sleep(QUIET_S)
        run.idle = rss_bytes(server.pid)
        run.latencies_ms.clear()
        run.statuses.clear()
        peak = RssSampler(server.pid, 0.5).start()
        started = time.monotonic()
        for burst in range(bursts):
            if burst:
                time.sleep(BURST_PAUSE_S)
            asyncio.run(post_all(server.url, large, concurrency, run))
        run.burst_s = time.monotonic() - started - BURST_PAUSE_S * (bursts - 1)
        run.peak = max(b for _, b in peak.stop())
        run.after_bursts = rss_bytes(server.pid)
        sampler = RssSampler(server.pid, 5.0).start()
        time.sleep(IDLE_AFTER_S + 0.5)  # the last sample lands at IDLE_AFTER_S
        run.idle_samples = sampler.stop()
    return run


def render(runs: Sequence[VariantRun], command: str, settings: Settings, args: argparse.Namespace) -> str:
    top_k = settings.max_predictions // settings.max_inputs
    lines = [
        "# Memory given back after bursts of large answers",
        "",
        f"`{command}`",
        "",
        f"- machine: {cpu_model()}, nproc {available_cpus()} (os.cpu_count {os.cpu_count()}); "
        f"CPU matrix features: {describe_features()}; load before {load_averages(args.load_before)}, "
        f"after {load_averages(os.getloadavg())}",
        f"- model: the default (2-layer BERT, hidden 128), maskserve on its defaults; Python {sys.version.split()[0]}",
        f"- traffic: {args.bursts} bursts x {args.per_burst} requests, each {settings.max_inputs} texts x "
        f"top_k {top_k} ({settings.max_predictions} predictions), concurrency {args.concurrency}, "
        f"{BURST_PAUSE_S:.0f} s between bursts; warm-up 64 small requests, then {QUIET_S:.0f} s quiet "
        f"before the idle reading",
        f"- glibc: maskserve with its idle trim kept still (benchmarks/no_idle_trim_server.py); idle-trim: "
        f"maskserve as it is (its IdleTrimmer on the scheduler's batches_run); "
        f"jemalloc: LD_PRELOAD={args.jemalloc}, MALLOC_CONF={args.jemalloc_conf}",
        f"- target: RSS after {IDLE_AFTER_S:.0f} s idle within {TARGET_BYTES / 10**6:.0f} MB "
        f"({TARGET_BYTES / MIB:.0f} MiB) of the idle RSS after warm-up",
        "",
        "RSS in MiB; throughput and latency over the bursts only.",
        "",
        f"| variant | malloc | after start | idle | peak | after bursts | after {IDLE_AFTER_S:.0f} s idle | "
        "kept | target met | req/s | p50 ms | p95 ms | statuses |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(run.row() for run in runs),
        "",
        *(run.curve() for run in runs),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_return", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: the default model)")
    parser.add_argument("--variants", default="glibc,idle-trim,jemalloc", help="comma-separated, run in this order")
    parser.add_argument("--jemalloc", type=Path, default=None, help="libjemalloc.so.2 to preload")
    parser.add_argument("--jemalloc-conf", default=JEMALLOC_CONF, help="MALLOC_CONF for the jemalloc variant")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--per-burst", type=int, default=80, help="requests in each burst")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help=f"write the report here too (e.g. {RESULTS})")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.load_before = os.getloadavg()
    model = args.model or default_model().path
    runs = []
    for variant in variants(args.variants.split(","), args.jemalloc, args.jemalloc_conf):
        runs.append(
            measure(
                variant,
                model,
                bursts=args.bursts,
                per_burst=args.per_burst,
                concurrency=args.concurrency,
                log_dir=CACHE_DIR / "logs",
            )
        )
        print(runs[-1].row(), flush=True)
    command = "python -m benchmarks.memory_return " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = render(runs, command, Settings(), args)
    print(report)
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")
    return 0 if all(200 in run.statuses and len(run.statuses) == 1 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
