"""What HAProxy costs in front of maskserve: one replica direct, one and three through the balancer.

    python -m benchmarks.fleet            # ~4 minutes on 2 cores; writes benchmarks/results/fleet.md

Three replicas (``python -m maskserve`` on the default model, one torch thread each, as in
tests/system/fleet/) on 127.0.0.11-13, and two HAProxies on 127.0.0.10 configured from
deploy/haproxy.cfg itself: one with replica 1 alone, one with all three. Rounds take turns between
the three ways in, at one fixed concurrency, and every answer is checked. The balancer's overhead
per request is the paired difference, inside each round, between replica 1 through HAProxy and
replica 1 direct; HAProxy's own CPU time per request is read from /proc.

On a 2-core machine three replicas cannot add compute: they share the cores that one replica and
the load generator already fill. The 3-replica line shows what balancing costs and what it
spreads, not how a fleet of real machines scales.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import sys
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from maskserve.config.cpus import available_cpus

from . import offline
from .haproxy import Address, HAProxy, documented_replica_flags, haproxy_version
from .load import Expected, LoadResult, percentile, run_load
from .models import CACHE_DIR, default_model
from .run import cpu_model, log, median, publish, spread
from .sentences import make_sentences
from .servers import Server, free_port

RESULTS = Path(__file__).resolve().parent / "results" / "fleet.md"
BALANCER_HOST = "127.0.0.10"
REPLICA_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
DIRECT, ONE, THREE = "1 replica, direct", "1 replica via HAProxy", "3 replicas via HAProxy"
SYSTEMS = (DIRECT, ONE, THREE)


@dataclass
class Measurement:
    load: LoadResult
    haproxy_cpu_s: float | None = None  # HAProxy's CPU time during the measurement


@dataclass
class Round:
    loads: dict[str, Measurement] = field(default_factory=dict)  # at --concurrency
    # One client, direct and through HAProxy: the balancer's added round trip, without the queueing
    # that dominates every latency at 16 clients.
    single: dict[str, LoadResult] = field(default_factory=dict)


@dataclass
class Rounds:
    rounds: list[Round] = field(default_factory=list)

    def of(self, system: str) -> list[Measurement]:
        return [r.loads[system] for r in self.rounds]

    def single(self, system: str) -> list[LoadResult]:
        return [r.single[system] for r in self.rounds]


def replica_argv(host: str, port: int) -> list[str]:
    """A replica as deploy/haproxy.cfg starts them (--torch-threads 1: three share the cores)."""
    return [sys.executable, "-m", "maskserve", "--host", host, "--port", str(port), *documented_replica_flags()]


def balancer(folder: Path, servers: Sequence[Address]) -> HAProxy:
    """deploy/haproxy.cfg as shipped (connection-level retries only) in front of ``servers``."""
    return HAProxy(folder, bind=(BALANCER_HOST, free_port(BALANCER_HOST)), servers=servers, l7_retries=False)


def measure(
    url: str, sentences: Sequence[str], expected: Sequence[Expected], concurrency: int, requests: int
) -> LoadResult:
    return asyncio.run(run_load(url, sentences, expected, concurrency=concurrency, requests=requests, time_cap_s=120.0))


def run(args: argparse.Namespace) -> tuple[Rounds, str]:
    model = default_model()
    sentences = make_sentences(args.mix)
    pipe = offline.load_pipeline(str(model.path))
    expected, _ = offline.reference_answers(pipe, sentences)
    del pipe
    log_dir = CACHE_DIR / "logs" / "fleet"
    results = Rounds()
    with ExitStack() as stack:
        replicas = []
        for i, host in enumerate(REPLICA_HOSTS, 1):
            port = free_port(host)
            replica = Server(f"replica{i}", replica_argv(host, port), port, log_dir / f"replica{i}.log", host=host)
            replicas.append(stack.enter_context(replica))
        addresses = [Address(r.name, host, r.port) for r, host in zip(replicas, REPLICA_HOSTS)]
        one = stack.enter_context(balancer(log_dir / "one", addresses[:1]))
        three = stack.enter_context(balancer(log_dir / "three", addresses))
        urls = {DIRECT: replicas[0].url, ONE: one.url, THREE: three.url}
        balancers = {ONE: one, THREE: three}
        for system in SYSTEMS:  # warm-up: every path once, every replica's first batches
            measure(urls[system], sentences, expected, args.concurrency, min(len(sentences), 256))
        for i in range(args.rounds):
            log(f"round {i + 1}/{args.rounds}")
            round_ = Round()
            for system in SYSTEMS[i % 3 :] + SYSTEMS[: i % 3]:  # take turns: drift hits each alike
                haproxy = balancers.get(system)
                cpu_before = haproxy.cpu_seconds() if haproxy else 0.0
                result = measure(urls[system], sentences, expected, args.concurrency, args.requests)
                cpu = haproxy.cpu_seconds() - cpu_before if haproxy else None
                round_.loads[system] = Measurement(result, cpu)
                log(
                    f"  {system:<24} {result.rps:8.1f} req/s  p50 {result.p(50):6.1f} ms  p99 {result.p(99):6.1f} ms"
                    f"  statuses {dict(result.statuses)}  wrong {result.wrong}"
                )
            for system in (DIRECT, ONE) if i % 2 == 0 else (ONE, DIRECT):
                result = measure(urls[system], sentences, expected, 1, args.single_requests)
                round_.single[system] = result
                log(f"  {system:<24} 1 client: p50 {result.p(50):6.2f} ms  statuses {dict(result.statuses)}")
            results.rounds.append(round_)
    return results, haproxy_version()


def render(results: Rounds, args: argparse.Namespace, command: str, haproxy: str, load: tuple[float, ...]) -> str:
    lines = [
        "# Fleet benchmark: HAProxy in front of maskserve",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {cpu_model()}, nproc {available_cpus()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {haproxy}",
        f"- replicas: `python -m maskserve {' '.join(documented_replica_flags())}` (as deploy/haproxy.cfg starts "
        "them) on the default model, on 127.0.0.11-13; "
        "HAProxy on 127.0.0.10 from deploy/haproxy.cfg (checks every 300 ms on /readyz, leastconn)",
        f"- load: {args.concurrency} closed-loop clients, {args.requests} requests per measurement over "
        f"{args.mix} sentences (23.5 tokens on average), every answer checked; {args.rounds} rounds in turns; "
        f"load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load)} at the end",
        "- req/s: correct answers per second, median of the rounds (min–max); latencies pool all rounds",
        "",
        "| system | req/s | p50 ms | p99 ms | statuses | wrong | HAProxy CPU per request |",
        "|---|---|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        measured = results.of(system)
        latencies = [ms for m in measured for ms in m.load.latencies_ms]
        statuses: Counter[str] = sum((m.load.statuses for m in measured), Counter())
        cpu = [m.haproxy_cpu_s / m.load.sent * 1e6 for m in measured if m.haproxy_cpu_s is not None]
        lines.append(
            f"| {system} | {spread([m.load.rps for m in measured])} | {percentile(latencies, 50):.1f} | "
            f"{percentile(latencies, 99):.1f} | "
            + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
            + f" | {sum(m.load.wrong for m in measured)} | "
            + (f"{median(cpu):.0f} µs |" if cpu else "– |")
        )
    direct, one, three = (results.of(s) for s in SYSTEMS)
    d_p50 = [o.load.p(50) - d.load.p(50) for o, d in zip(one, direct)]
    d_p99 = [o.load.p(99) - d.load.p(99) for o, d in zip(one, direct)]
    # Little's law: at a fixed concurrency c, the mean time per request is c / throughput.
    d_mean = [args.concurrency * 1000 * (1 / o.load.rps - 1 / d.load.rps) for o, d in zip(one, direct)]
    single_direct, single_one = results.single(DIRECT), results.single(ONE)
    d_single = [o.p(50) - d.p(50) for o, d in zip(single_one, single_direct)]
    lines += [
        "",
        "| balancer overhead per request (1 replica via HAProxy − direct, paired per round) | median (min–max) |",
        "|---|---|",
        f"| p50 latency, 1 client ({median([d.p(50) for d in single_direct]):.2f} ms direct) | "
        f"{spread(d_single, '{:+.2f}')} ms |",
        f"| p50 latency, {args.concurrency} clients | {spread(d_p50, '{:+.2f}')} ms |",
        f"| p99 latency, {args.concurrency} clients | {spread(d_p99, '{:+.2f}')} ms |",
        f"| mean latency, {args.concurrency} clients (c / throughput) | {spread(d_mean, '{:+.2f}')} ms |",
        f"| throughput, via HAProxy / direct | {median([o.load.rps / d.load.rps for o, d in zip(one, direct)]):.2f}× |",
        f"| throughput, 3 replicas / 1 replica (both via HAProxy) | "
        f"{median([t.load.rps / o.load.rps for t, o in zip(three, one)]):.2f}× |",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--single-requests", type=int, default=200, help="requests of the 1-client measurements")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mix", type=int, default=128, help="sentences in the mix")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the Markdown table goes")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results, haproxy = run(args)
    command = ("python -m benchmarks.fleet " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    report = render(results, args, command, haproxy, os.getloadavg())
    publish(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
