"""Two models in one server against two single-model servers on the same cores.

    python -m benchmarks.several_models                 # about 6 minutes on 2 cores
    python -m benchmarks.several_models --seconds 10    # a quick look

Each model is under its own load at once: one flooded (a closed loop of ``--flood`` clients), one
light (one client). Two scenarios: the small default model flooded while the bert-base-shaped one
is light, and the other way round. For each, the same loads run against ``maskserve --model a=...
--model b=...`` (one process, one inference thread shared by the scheduler) and against two
``maskserve --model ...`` processes on the same cores (each with its own threads, as a proxy in
front of two servers would run them). Reported: each model's answers per second, the flooded
model's median latency, the light model's median and p99 latency, and the resident memory of one
server against the two together. With the large model flooded, a third layout holds its passes to
``--cap`` padded tokens (its own ``max_batch_tokens`` in a models file): a light model waits for
the pass in flight, so this bounds its wait.
Every answer is checked against the pipeline's. The report starts with the CPU and its flags.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maskserve.engine.cpu import cpu_flags, describe_features

from . import offline
from .load import Expected, LoadResult, run_load
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .run import cpu_model
from .sentences import make_sentences
from .servers import Server, free_port, rss_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "several-models.md"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Load:
    """One model's traffic in a scenario: which model, under what name, how many clients."""

    name: str
    model: BenchModel
    concurrency: int
    sentences: list[str]
    expected: list[Expected]


@dataclass(frozen=True)
class Outcome:
    """One layout (one server or two) under a scenario's two loads at once."""

    results: dict[str, LoadResult]
    rss: int  # bytes: the one server's, or the two servers' summed


def references(model: BenchModel, count: int) -> tuple[list[str], list[Expected]]:
    pipe = offline.load_pipeline(str(model.path))
    sentences = make_sentences(count)
    expected, _ = offline.reference_answers(pipe, sentences)
    return sentences, expected


async def both_loads(urls: dict[str, str], loads: Sequence[Load], seconds: float) -> dict[str, LoadResult]:
    """Every load at once for ``seconds`` (each bounded by a request count as well)."""
    runs = [
        run_load(
            urls[load.name],
            load.sentences,
            load.expected,
            concurrency=load.concurrency,
            requests=int(seconds * 2000),
            time_cap_s=seconds,
        )
        for load in loads
    ]
    return dict(zip((load.name for load in loads), await asyncio.gather(*runs), strict=True))


def warm(urls: dict[str, str], loads: Sequence[Load]) -> None:
    """One pass of each model's sentences at c=4, so that both layouts start from fitted cost models."""
    for load in loads:
        asyncio.run(run_load(urls[load.name], load.sentences, load.expected, concurrency=4, requests=64, time_cap_s=60))


def one_server(loads: Sequence[Load], seconds: float, logs: Path, capped_tokens: int | None = None) -> Outcome:
    """Both models in one server; with ``capped_tokens``, the flooded (first) model's passes held to
    that many padded tokens by its own ``max_batch_tokens`` in a models file."""
    argv = [sys.executable, "-m", "maskserve", "--port", str(port := free_port())]
    if capped_tokens is None:
        for load in loads:
            argv += ["--model", f"{load.name}={load.model.path}"]
    else:
        flooded, light = loads
        models = logs / "several-models.yaml"
        models.parent.mkdir(parents=True, exist_ok=True)
        models.write_text(
            f"models:\n  - name: {flooded.name}\n    source: {flooded.model.path}\n"
            f"    max_batch_tokens: {capped_tokens}\n  - name: {light.name}\n    source: {light.model.path}\n",
            encoding="utf-8",
        )
        argv += ["--models-file", str(models)]
    with Server("one server", argv, port, logs / "one-server.log") as server:
        urls = {load.name: f"{server.url}models/{load.name}" for load in loads}
        warm(urls, loads)
        results = asyncio.run(both_loads(urls, loads, seconds))
        return Outcome(results, rss_bytes(server.pid))


def two_servers(loads: Sequence[Load], seconds: float, logs: Path) -> Outcome:
    servers = [
        Server(
            load.name,
            [sys.executable, "-m", "maskserve", "--model", str(load.model.path), "--port", str(port := free_port())],
            port,
            logs / f"two-servers-{load.name}.log",
        )
        for load in loads
    ]
    try:
        for server in servers:
            server.start()
        urls = {load.name: server.url for load, server in zip(loads, servers, strict=True)}
        warm(urls, loads)
        results = asyncio.run(both_loads(urls, loads, seconds))
        return Outcome(results, sum(rss_bytes(server.pid) for server in servers))
    finally:
        for server in servers:
            server.stop()


def scenario_rows(
    title: str, loads: Sequence[Load], one: Outcome, two: Outcome, capped: tuple[int, Outcome] | None = None
) -> list[str]:
    flooded, light = loads
    rows = [
        f"### {title}",
        "",
        f"`{flooded.name}` ({flooded.model.name}) flooded by {flooded.concurrency} clients; "
        f"`{light.name}` ({light.model.name}) light, one client.",
        "",
        "| layout | flooded answers/s | flooded p50 ms | light answers/s | light p50 ms | light p99 ms "
        "| wrong or failed | RSS MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    layouts = [("one server, two models", one), ("two servers, one model each", two)]
    if capped is not None:
        layouts.append((f"one server, `{flooded.name}`'s passes held to {capped[0]} tokens", capped[1]))
    for layout, outcome in layouts:
        f, lt = outcome.results[flooded.name], outcome.results[light.name]
        failed = f.failed + lt.failed
        rows.append(
            f"| {layout} | {f.rps:.1f} | {f.p(50):.1f} | {lt.rps:.1f} | {lt.p(50):.1f} | {lt.p(99):.1f} | {failed} "
            f"| {outcome.rss / MIB:.0f} |"
        )
    f1, f2 = one.results[flooded.name], two.results[flooded.name]
    l1, l2 = one.results[light.name], two.results[light.name]
    rows += [
        "",
        f"One server against two: flooded throughput {f1.rps / f2.rps:.2f}×, light throughput "
        f"{l1.rps / l2.rps:.2f}×, light p50 {l1.p(50) / l2.p(50):.2f}×, memory {one.rss / two.rss:.2f}× "
        f"({(two.rss - one.rss) / MIB:.0f} MiB less).",
        "",
    ]
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.several_models", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="seconds of load per layout and scenario")
    parser.add_argument("--flood", type=int, default=32, help="clients of the flooded model")
    parser.add_argument("--mix", type=int, default=128, help="distinct sentences per model")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--cap",
        type=int,
        default=64,
        help="with the large model flooded, a third layout: its max_batch_tokens held to this (0: none)",
    )
    parser.add_argument(
        "--large", type=Path, default=None, help="the large model's folder (default: bert-base's shape, built once)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    small = default_model()
    large = BenchModel(str(args.large), args.large) if args.large else bert_base_model()
    small_ref, large_ref = references(small, args.mix), references(large, args.mix)
    logs = CACHE_DIR / "logs"
    scenarios = [
        (
            "The small model flooded, the large one light",
            [Load("small", small, args.flood, *small_ref), Load("large", large, 1, *large_ref)],
        ),
        (
            "The large model flooded, the small one light",
            [Load("large", large, args.flood, *large_ref), Load("small", small, 1, *small_ref)],
        ),
    ]
    command = "python -m benchmarks.several_models" + "".join(
        f" {flag} {value}"
        for flag, value, default in (
            ("--seconds", args.seconds, 45.0),
            ("--flood", args.flood, 32),
            ("--mix", args.mix, 128),
            ("--cap", args.cap, 64),
            ("--large", args.large, None),
        )
        if value != default
    )
    simd = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx_vnni", "avx2")))
    lines = [
        "# Several models: one server against one server per model",
        "",
        f"Command: `{command}`. CPU: {cpu_model()}; matrix features: {describe_features()}; "
        f"flags: {', '.join(simd) or 'none'}. Each layout ran {args.seconds:g} s per scenario, both loads at "
        "once, on the same cores; every answer checked against the pipeline's. RSS is measured after the load: "
        "the one server's, or the two servers' summed.",
        "",
    ]
    for number, (title, loads) in enumerate(scenarios):
        one = one_server(loads, args.seconds, logs)
        two = two_servers(loads, args.seconds, logs)
        # A light model waits for the pass in flight: a large flooded model's own token budget bounds it.
        capped = (args.cap, one_server(loads, args.seconds, logs, args.cap)) if number == 1 and args.cap else None
        lines += scenario_rows(title, loads, one, two, capped)
        print("\n".join(lines), flush=True)
    report = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n", encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
