"""Each reduced precision's rate over HTTP at 64 clients on bert-base's shape: today's graph
against the one before, in one run.

    python -m benchmarks.precision_rates                   # bert-base's shape: a few minutes once its graphs are cached
    python -m benchmarks.precision_rates --model default   # the default model

Servers (``--backend openvino`` on a random model of bert-base's shape, or the default model): float32; bfloat16 as
served today (the last layer and the head in float32) and whole in bfloat16 as before; int8 by
today's recipe and by the `vnni` recipe before the last layer's read rows were kept in float32
(benchmarks/precision_before_server.py). Rounds take turns between them, one server computing at a
time; each pair's ratio is taken inside each round and the median reported, since a shared
machine's rate drifts between rounds by more than the differences measured.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import offline
from .agreement import cpu_line
from .load import LoadResult
from .models import BenchModel, bert_base_model, default_model
from .run import EXPORT_CACHE, Plan, Round, log, measure_server, publish, warm_up
from .sentences import make_sentences
from .servers import Server, free_port, maskserve_argv

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"bert-base": bert_base_model, "default": default_model}
CONCURRENCY = 64
# Requests per measurement: a few seconds of each server, on either model.
PLANS = {
    "bert-base": Plan(32, {CONCURRENCY: 384}, (), 5, 300.0),
    "default": Plan(128, {CONCURRENCY: 3072}, (), 5, 300.0),
}


@dataclass(frozen=True)
class System:
    name: str
    flags: tuple[str, ...]
    before: str | None = None  # precision_before_server's variant, or maskserve as it is


SYSTEMS = (
    System("openvino float32", ()),
    System("openvino bf16, last layer float32 (today)", ("--dtype", "bfloat16")),
    System("openvino bf16, whole (before)", ("--dtype", "bfloat16"), "bf16-whole"),
    System("openvino int8, today's recipe", ("--quantize", "int8")),
    System("openvino int8, the recipe before", ("--quantize", "int8"), "int8-before"),
)
PAIRS = ((SYSTEMS[1].name, SYSTEMS[2].name), (SYSTEMS[3].name, SYSTEMS[4].name))


def server_for(system: System, model: Path, log_dir: Path) -> Server:
    port = free_port()
    argv = maskserve_argv(model, port, "--backend", "openvino", *system.flags, "--cache-dir", str(EXPORT_CACHE))
    if system.before is not None:
        argv[1:3] = ["-m", "benchmarks.precision_before_server", system.before]
    return Server(system.name, argv, port, log_dir / f"{system.name.split(',')[0].replace(' ', '-')}-{port}.log")


def measure(model: BenchModel, plan: Plan, rounds: int, log_dir: Path) -> list[Round]:
    pipe = offline.load_pipeline(str(model.path))
    sentences = make_sentences(plan.mix)
    expected, _ = offline.reference_answers(pipe, sentences)
    done: list[Round] = []
    with contextlib.ExitStack() as stack:
        servers = []
        for system in SYSTEMS:  # one at a time: the others are paused while it starts
            server = stack.enter_context(server_for(system, model.path, log_dir))
            warm_up(server, sentences, expected, plan)
            server.pause()
            servers.append(server)
        for i in range(rounds):
            log(f"round {i + 1}/{rounds}")
            round_ = Round()
            turn = i % len(servers)
            for server in servers[turn:] + servers[:turn]:  # take turns: drift hits each alike
                measure_server(server, round_, sentences, expected, plan, [CONCURRENCY])
            done.append(round_)
    return done


def render(model: BenchModel, plan: Plan, rounds: Sequence[Round], command: str) -> str:
    def load(r: Round, name: str) -> LoadResult:
        return r.loads[name, CONCURRENCY]

    lines = [
        f"# Reduced precisions over HTTP at {CONCURRENCY} clients: today's graphs against the ones before",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- {cpu_line()}",
        f"- model: {model.name}; {plan.mix} sentences, {plan.requests_at(CONCURRENCY)} "
        f"requests per measurement at {CONCURRENCY} clients, {len(rounds)} rounds taking turns",
        "- req/s: right answers per second (the top token among the float32 pipeline's first five), median "
        "of the rounds (min-max); ratios: the median of the per-round ratios",
        "",
        "| server | req/s | p50 ms | p99 ms | statuses | wrong answers |",
        "|---|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        results = [load(r, system.name) for r in rounds]
        rates = [x.rps for x in results]
        statuses: Counter[str] = sum((x.statuses for x in results), Counter())
        latencies = [ms for x in results for ms in x.latencies_ms]
        p50, p99 = statistics.quantiles(latencies, n=100)[49], statistics.quantiles(latencies, n=100)[98]
        lines.append(
            f"| {system.name} | {statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) | {p50:.0f} "
            f"| {p99:.0f} | {', '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))} "
            f"| {sum(x.wrong for x in results)} |"
        )
    lines += [
        "",
        "| today | before | today's req/s against before's (median, min-max of the rounds) |",
        "|---|---|---|",
    ]
    for today, before in PAIRS:
        ratios = [load(r, today).rps / load(r, before).rps for r in rounds]
        lines.append(f"| {today} | {before} | {statistics.median(ratios):.2f}× ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return "\n".join([*lines, ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.precision_rates", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="bert-base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="the report (default: results/precision-rates[-default].md)")
    parser.add_argument("--log-dir", type=Path, default=EXPORT_CACHE.parent / "logs")
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(args_list)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    model = MODELS[args.model]()
    out = args.out or RESULTS / ("precision-rates.md" if args.model == "bert-base" else "precision-rates-default.md")
    plan = PLANS[args.model]
    rounds = measure(model, plan, args.rounds, args.log_dir)
    publish(render(model, plan, rounds, " ".join(["python -m benchmarks.precision_rates", *args_list])), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
