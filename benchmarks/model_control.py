"""Model control's targets on a real maskserve: one memory budget across workers, reloads under
traffic, and an unload beside another model's slow load.

    python -m benchmarks.model_control --out benchmarks/results/model-control.md   # about 5 minutes on 2 cores
    python -m benchmarks.model_control --quick     # the default model in every role, tiny counts: for the test

Three phases, each judged against its target:

1. **budget**: ``--workers 2 --model-control-mode on-demand --models-memory B --model-min-residency 0``
   on a repository of the default model (``small``, named at start) and three random models of one
   shape (``m1``, ``m2``, ``m3``), B chosen so that each worker's share holds ``small`` and two of
   them, never three (at the sizes a single server measured at their loads: phase 2 runs first).
   Rounds of on-demand requests to the three, each on a connection of its own (so the kernel
   spreads them over both workers); the workers' VmRSS summed before and after, a
   quiet spell past the idle trim before each reading; the peak sampled in between.
2. **reloads**: one maskserve in explicit control; six clients, three on ``POST /v2/models/m1/infer``
   and three on ``POST /models/m1``, each sending its body in two parts (a reload can come between
   them), while ``m1`` is reloaded three times, each with another ``parameters.config``.
3. **unload beside a load**: on the same server, a larger model (``slow``) is loaded alone and
   timed, then loaded again while ``m1`` is unloaded at points spread over the load; then the
   same with the load's warm-up off, which shows what the warm-up passes add.

Every 200 answer is checked against the offline pipeline's for its sentence. The report starts with
the CPU, its flags and the load averages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from maskserve.config.cpus import available_cpus
from maskserve.engine.cpu import cpu_flags, describe_features

from .load import Expected, check_answer
from .models import CACHE_DIR, BenchModel, build_random_model, default_model
from .repository import CONTROL_KEY, assemble_repository, references, verdict_table
from .run import cpu_model, load_averages
from .servers import Server, free_port, rss_bytes

MIB = 1024 * 1024
RESULTS = Path(__file__).resolve().parent / "results" / "model-control.md"
SMALL, MODELS, SLOW = "small", ("m1", "m2", "m3"), "slow"
# The targets.
GROWTH_TARGET = 1.15  # x the budget: what the workers together may grow by
UNLOAD_TARGET_S = 1.0
# Longer than the idle trim's delay plus one look (memory.IDLE_TRIM_DELAY_S, IDLE_POLL_S).
QUIET_S = 15.0
# Shapes (bert-base's, fewer layers): the budget's three models, and one whose load takes seconds.
BUDGET_LAYERS, SLOW_LAYERS = 2, 12
PACES = (0.001, 0.01, 0.05)  # seconds between the two parts of a body, one client each per route


@dataclass(frozen=True)
class Plan:
    rounds: int  # of on-demand requests to m1, m2, m3 in turn
    per_model: int  # requests to each model in a round, two at a time
    quiet_s: float
    lead_s: float  # traffic before the first reload and between reloads
    offsets: tuple[float, ...]  # when each unload starts, as a share of the slow load's solo time


FULL = Plan(rounds=4, per_model=8, quiet_s=QUIET_S, lead_s=1.0, offsets=(0.1, 0.3, 0.5, 0.7, 0.9))
QUICK = Plan(rounds=1, per_model=2, quiet_s=1.0, lead_s=0.2, offsets=(0.5,))


@dataclass(frozen=True)
class Trial:
    """One unload of ``m1`` while ``slow`` loads."""

    warmup: bool  # whether slow's load ran its warm-up passes (the default) or skipped them
    sent_s: float  # when the unload was sent, seconds into the load
    load_s: float
    unload_s: float
    beside: bool  # the load was still under way when the unload answered
    warmup_s: float = math.nan  # slow's warm-up in this load, from the server's log


@dataclass
class Report:
    budget_bytes: int = 0
    weights: dict[str, int] = field(default_factory=dict)  # bytes on disk, by model
    measured: dict[str, int] = field(default_factory=dict)  # bytes, by model: the index's memory_bytes
    rss_before: int = 0  # the workers' VmRSS summed
    rss_after: int = 0
    rss_peak: int = 0
    budget_statuses: Counter[str] = field(default_factory=Counter)
    charged: dict[tuple[str, str], float] = field(default_factory=dict)  # (worker, model): bytes
    on_demand_loads: int = 0
    evictions: int = 0
    reload_s: list[float] = field(default_factory=list)
    reloads_counted: float = 0.0  # the server's own count of reloads that ended serving
    route_statuses: dict[str, Counter[str]] = field(default_factory=dict)
    wrong: int = 0
    first_failures: list[str] = field(default_factory=list)
    solo_load_s: dict[bool, float] = field(default_factory=dict)  # by warm-up on or off
    solo_warmup_s: float = math.nan
    trials: list[Trial] = field(default_factory=list)

    def fail(self, what: str) -> None:
        if len(self.first_failures) < 5:
            self.first_failures.append(what)


def weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def workers_of(arbiter: int) -> list[int]:
    with open(f"/proc/{arbiter}/task/{arbiter}/children", encoding="ascii") as f:
        return [int(pid) for pid in f.read().split()]


def scrape(base: str) -> str:
    with urllib.request.urlopen(base + "metrics", timeout=60) as response:
        return str(response.read().decode())


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` in a scrape: its labels and value."""
    return [
        (dict(re.findall(r'(\w+)="([^"]*)"', line)), float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith(name + "{")
    ]


class SumSampler:
    """The summed VmRSS of ``pids`` every half second on a daemon thread; keeps the peak."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids, self.peak = list(pids), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(OSError, RuntimeError):  # a worker gone: the run fails on its own
                self.peak = max(self.peak, sum(rss_bytes(pid) for pid in self.pids))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def infer_body(text: str) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}).encode()


def answer_of(route: str, body: bytes) -> Any:
    """The predictions for the one text sent: the HF JSON as it is, the OIP output's first item."""
    answer = json.loads(body)
    if route == "oip":
        [output] = [o for o in answer["outputs"] if o["name"] == "predictions"]
        return json.loads(output["data"][0])
    return answer


async def in_two_parts(body: bytes, pause: float) -> AsyncIterator[bytes]:
    yield body[: len(body) // 2]
    await asyncio.sleep(pause)
    yield body[len(body) // 2 :]


def checked(report: Report, route: str, status: int, body: bytes, expected: Expected, which: str) -> str:
    """The status as counted: a 200 whose answer is not its sentence's counts as ``wrong``."""
    if status != 200:
        report.fail(f"{which}: {status} {body[:160]!r}")
        return str(status)
    reason = check_answer(answer_of(route, body), expected)
    if reason is not None:
        report.wrong += 1
        report.fail(f"{which}: {reason}")
        return "wrong"
    return "200"


# -- 1. one budget across two workers ---------------------------------------------------------


async def on_demand_rounds(
    base: str, refs: dict[str, tuple[list[str], list[Expected]]], plan: Plan, report: Report
) -> None:
    """Requests to m1, m2, m3 in turn, each on a fresh connection, two at a time."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        for _ in range(plan.rounds):
            for model in MODELS:
                queue = list(range(plan.per_model))
                await asyncio.gather(*(ask(session, base, model, refs[model], queue, report) for _ in range(2)))


async def ask(
    session: aiohttp.ClientSession,
    base: str,
    model: str,
    refs: tuple[list[str], list[Expected]],
    queue: list[int],
    report: Report,
) -> None:
    """One client: the next of ``queue``'s sentences to ``model`` until none is left."""
    sentences, expected = refs
    while queue:
        k = queue.pop() % len(sentences)
        async with session.post(f"{base}models/{model}", data=sentences[k].encode()) as response:
            body = await response.read()
        status = checked(report, "hf", response.status, body, expected[k], f"{model} sentence {k}")
        report.budget_statuses[status] += 1


def measure_budget(
    small: BenchModel, models: dict[str, Path], refs: dict[str, Any], plan: Plan, report: Report, log: Path
) -> None:
    report.weights = {SMALL: weights_bytes(small.path)} | {name: weights_bytes(path) for name, path in models.items()}
    # The budget counts what a load measures, more than the weights (the tokenizer, the runtime's
    # tables): a worker's share is halfway between small and two models at the sizes the single
    # server measured (phase 2 runs first) and the least three can be charged (their weights).
    two = report.measured[SMALL] + 2 * report.measured[MODELS[0]]
    share = (two + 3 * min(report.weights[name] for name in models)) / 2
    report.budget_bytes = budget = int(2 * share)
    with tempfile.TemporaryDirectory(prefix="maskserve-control-") as tmp:
        repository = assemble_repository(Path(tmp), {SMALL: small.path, **models})
        port = free_port()
        argv = [sys.executable, "-m", "maskserve", "--model-repository", str(repository), "--model", SMALL]
        argv += ["--model-control-mode", "on-demand", "--workers", "2", "--models-memory", str(budget)]
        argv += ["--model-min-residency", "0", "--port", str(port)]
        env = {"MASKSERVE_CONTROL_KEY": CONTROL_KEY, "TMPDIR": "/tmp"}  # a short path for the workers' sockets
        with Server("maskserve --workers 2", argv, port, log, env=env) as server:
            base = server.url
            deadline = time.monotonic() + 300
            while not (
                len(workers_of(server.pid)) == 2 and 'worker="1"' in scrape(base) and 'worker="0"' in scrape(base)
            ):
                if time.monotonic() > deadline:
                    raise SystemExit(f"two workers did not both answer: {server.log_tail()}")
                time.sleep(1.0)
            workers = workers_of(server.pid)
            time.sleep(plan.quiet_s)
            report.rss_before = sum(rss_bytes(pid) for pid in workers)
            print(f"budget: before {report.rss_before / MIB:.0f} MiB", flush=True)
            sampler = SumSampler(workers)
            asyncio.run(on_demand_rounds(base, refs, plan, report))
            report.rss_peak = sampler.stop()
            report.charged = {
                (labels.get("worker", "0"), labels["model"]): value
                for labels, value in series(scrape(base), "maskserve_model_memory_bytes")
            }
            time.sleep(plan.quiet_s)
            report.rss_after = sum(rss_bytes(pid) for pid in workers)
            print(f"budget: after {report.rss_after / MIB:.0f} MiB", flush=True)
            if sorted(workers_of(server.pid)) != sorted(workers):
                raise SystemExit(f"a worker was replaced during the run: {server.log_tail()}")
        text = log.read_text(encoding="utf-8", errors="replace")
        report.on_demand_loads = text.count("by an inference request: ready")
        report.evictions = text.count("evicting ")


# -- 2 and 3. reloads under traffic, an unload beside a load --------------------------------------


async def reloads_under_traffic(base: str, refs: tuple[list[str], list[Expected]], plan: Plan, report: Report) -> None:
    name = MODELS[0]
    sentences, expected = refs
    done = asyncio.Event()
    routes = {"oip": f"{base}v2/models/{name}/infer", "hf": f"{base}models/{name}"}

    async def client(session: aiohttp.ClientSession, route: str, pause: float, first: int) -> None:
        statuses = report.route_statuses.setdefault(route, Counter())
        i = first
        while not done.is_set():
            k = i % len(sentences)
            i += 1
            body = infer_body(sentences[k]) if route == "oip" else sentences[k].encode()
            async with session.post(routes[route], data=in_two_parts(body, pause)) as response:
                answer = await response.read()
            statuses[checked(report, route, response.status, answer, expected[k], f"{route} sentence {k}")] += 1

    async def reload(session: aiohttp.ClientSession) -> None:
        try:
            for batch in (16, 8, 32):  # another configuration each time: each a real reload
                await asyncio.sleep(plan.lead_s)
                config = json.dumps({"max_batch_size": batch})
                report.reload_s.append(await change(session, base, name, "load", config))
            await asyncio.sleep(plan.lead_s)
        finally:
            done.set()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        clients = [
            client(session, route, pause, 7 * n)
            for n, (route, pause) in enumerate((route, pause) for route in routes for pause in PACES)
        ]
        await asyncio.gather(reload(session), *clients)


async def change(session: aiohttp.ClientSession, base: str, name: str, action: str, config: str | None = None) -> float:
    """Load (with ``config``, a JSON object as a string) or unload ``name``; its duration in seconds.
    Raises on any answer but 200."""
    body = {"parameters": {"config": config}} if config is not None else {}
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {CONTROL_KEY}"}
    async with session.post(f"{base}v2/repository/models/{name}/{action}", json=body, headers=headers) as response:
        answer = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{action} of {name!r}: {response.status} {answer[:200]!r}")
    return time.perf_counter() - started


async def unloads_beside_loads(base: str, plan: Plan, report: Report, warmup: bool) -> None:
    """``slow`` loaded alone, then again while ``m1`` is unloaded at each of the plan's points of
    the load; ``warmup`` off: the load reads the weights only, which shows what the warm-up adds."""
    config = None if warmup else json.dumps({"warmup": False})
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        solo = report.solo_load_s[warmup] = await change(session, base, SLOW, "load", config)
        await change(session, base, SLOW, "unload")
        for offset in plan.offsets:
            started = time.perf_counter()
            loading = asyncio.create_task(change(session, base, SLOW, "load", config))
            await asyncio.sleep(offset * solo)
            sent_s = time.perf_counter() - started
            unload_s = await change(session, base, MODELS[0], "unload")
            beside = not loading.done()
            report.trials.append(Trial(warmup, sent_s, await loading, unload_s, beside))
            await change(session, base, SLOW, "unload")
            await change(session, base, MODELS[0], "load")


async def load_once(base: str, name: str) -> float:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        return await change(session, base, name, "load")


def measured_sizes(base: str) -> dict[str, int]:
    """Each loaded model's size as its load measured it (the index's ``memory_bytes``)."""
    request = urllib.request.Request(base + "v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return {entry["name"]: int(entry["memory_bytes"]) for entry in json.load(response) if "memory_bytes" in entry}


def measure_changes(
    small: BenchModel,
    m1: Path,
    slow: Path,
    refs: tuple[list[str], list[Expected]],
    plan: Plan,
    report: Report,
    log: Path,
) -> None:
    with tempfile.TemporaryDirectory(prefix="maskserve-control-") as tmp:
        repository = assemble_repository(Path(tmp), {SMALL: small.path, MODELS[0]: m1, SLOW: slow})
        port = free_port()
        argv = [sys.executable, "-m", "maskserve", "--model-repository", str(repository), "--model", SMALL]
        argv += ["--model-control-mode", "explicit", "--port", str(port)]
        with Server("maskserve", argv, port, log, env={"MASKSERVE_CONTROL_KEY": CONTROL_KEY}) as server:
            base = server.url
            asyncio.run(load_once(base, MODELS[0]))
            report.measured = measured_sizes(base)
            asyncio.run(reloads_under_traffic(base, refs, plan, report))
            report.reloads_counted = sum(
                value
                for labels, value in series(scrape(base), "maskserve_model_changes_total")
                if labels.get("model") == MODELS[0]
                and labels.get("action") == "reload"
                and labels.get("result") == "ok"
            )
            print(f"reloads: {report.reload_s}", flush=True)
            for warmup in (True, False):
                asyncio.run(unloads_beside_loads(base, plan, report, warmup))
            print(f"unloads: {report.trials}", flush=True)
        # Each warmed-up load of slow's warm-up, in order: the solo load's, then each try's.
        text = log.read_text(encoding="utf-8", errors="replace")
        warmups = [float(s) for s in re.findall(rf"{SLOW} warmed up in ([\d.]+)s", text)]
        report.solo_warmup_s = warmups[0]
        tries = [i for i, trial in enumerate(report.trials) if trial.warmup]
        for i, seconds in zip(tries, warmups[1:], strict=True):
            report.trials[i] = dataclasses.replace(report.trials[i], warmup_s=seconds)


# -- the report -----------------------------------------------------------------------------------


def verdicts(report: Report) -> list[tuple[str, bool, str]]:
    """Each target: its statement, whether met, the figures it was judged on."""
    grown = report.rss_after - report.rss_before
    others = sum(n for statuses in report.route_statuses.values() for s, n in statuses.items() if s != "200")
    answered = sum(sum(statuses.values()) for statuses in report.route_statuses.values())
    # Judged on the unloads that ended while the load ran: one that ended after it was not beside it.
    beside = [trial.unload_s for trial in report.trials if trial.beside and trial.warmup]
    slowest = max(beside, default=math.nan)
    cold = max((t.unload_s for t in report.trials if t.beside and not t.warmup), default=math.nan)
    charged = sum(report.charged.values())
    return [
        (
            f"`--workers 2 --models-memory B`, on-demand requests to three models of which two fit: the workers "
            f"together grow by at most {GROWTH_TARGET:g} B",
            grown <= GROWTH_TARGET * report.budget_bytes,
            f"{grown / MIB:+.0f} MiB against B = {report.budget_bytes / MIB:.0f} MiB "
            f"({grown / report.budget_bytes:.2f} B); peak {(report.rss_peak - report.rss_before) / MIB:+.0f} MiB; the "
            f"models charged {charged / MIB:.0f} MiB at the end",
        ),
        (
            "3 reloads under 6 clients (REST infer route and `POST /models/{m}`): 0 answers other than 200",
            others == 0 and report.reloads_counted == 3,
            f"{others} of {answered} answers other than a right 200; {report.reloads_counted:g} reloads counted by the "
            f"server, each {min(report.reload_s, default=0):.2f}-{max(report.reload_s, default=0):.2f} s",
        ),
        (
            f"an unload beside another model's load returns in under {UNLOAD_TARGET_S:g} s",
            bool(beside) and slowest < UNLOAD_TARGET_S,
            f"slowest unload {slowest:.2f} s of the {len(beside)} that ended while the load ran, the load alone "
            f"{report.solo_load_s.get(True, math.nan):.2f} s; with the load's warm-up off: slowest {cold:.2f} s",
        ),
    ]


def render(report: Report, plan: Plan, args: argparse.Namespace, command: str, names: dict[str, str]) -> str:
    simd = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx_vnni", "avx2")))
    before = report.rss_before
    lines = [
        "# Model control: one budget across workers, reloads under traffic, an unload beside a load",
        "",
        f"`{command}`",
        "",
        f"- machine: {cpu_model()}, nproc {available_cpus()} (os.cpu_count {os.cpu_count()}); CPU matrix "
        f"features: {describe_features()}; flags: {', '.join(simd) or 'none'}",
        f"- load averages (1/5/15 min): before {load_averages(args.load_before)}, after "
        f"{load_averages(os.getloadavg())}",
        f"- models: `{SMALL}` {names[SMALL]}; `m1`, `m2`, `m3` {names['m1']}; `{SLOW}` {names[SLOW]}; weights on "
        "disk (MiB): " + ", ".join(f"`{name}` {size / MIB:.0f}" for name, size in report.weights.items()),
        f"- Python {sys.version.split()[0]}; quiet spells {plan.quiet_s:g} s",
        "",
        "## One budget across two workers",
        "",
        f"`--workers 2 --model-control-mode on-demand --model {SMALL} --models-memory {report.budget_bytes}` "
        f"({report.budget_bytes / MIB:.0f} MiB: each worker's share halfway between `{SMALL}` and two of the models at "
        "the sizes the single server measured at their loads ("
        + ", ".join(f"`{name}` {size / MIB:.0f} MiB" for name, size in report.measured.items())
        + ") and three at their weights' size, the least a load is charged"
        f") `--model-min-residency 0`; {plan.rounds} rounds of {plan.per_model} requests to `m1`, "
        "`m2`, `m3` in turn, two at a time, each on a connection of its own.",
        "",
        "| the workers' VmRSS summed | MiB | change |",
        "|---|---|---|",
        f"| before, after a quiet spell | {before / MIB:.0f} | |",
        *(
            f"| {label} | {rss / MIB:.0f} | {(rss - before) / MIB:+.0f} |"
            for label, rss in (
                ("peak while the requests ran", report.rss_peak),
                ("after, after a quiet spell", report.rss_after),
            )
        ),
        "",
        f"- answers: {dict(sorted(report.budget_statuses.items()))}; on-demand loads {report.on_demand_loads}, "
        f"evictions {report.evictions} (the server's log)",
        "- charged at the end (`maskserve_model_memory_bytes`, MiB): "
        + "; ".join(
            f"worker {worker}: "
            + ", ".join(f"`{m}` {v / MIB:.0f}" for (w, m), v in sorted(report.charged.items()) if w == worker)
            for worker in sorted({w for w, _ in report.charged})
        ),
        "",
        "## Three reloads under six clients",
        "",
        f"One maskserve, `--model-control-mode explicit --model {SMALL}`, `m1` loaded; six clients, three per route, "
        f"each sending its body in two parts {', '.join(f'{p * 1000:g}' for p in PACES)} ms apart; `m1` reloaded "
        f"with `max_batch_size` 16, 8, 32, {plan.lead_s:g} s of traffic before, between and after.",
        "",
        "| route | answers |",
        "|---|---|",
        *(
            f"| {route} | {dict(sorted(statuses.items()))} |"
            for route, statuses in sorted(report.route_statuses.items())
        ),
        "",
        f"- reloads: {', '.join(f'{s:.2f} s' for s in report.reload_s)}; counted by the server "
        f"(`maskserve_model_changes_total`, reload ok): {report.reloads_counted:g}",
        "",
        "## An unload beside a load",
        "",
        f"The same server: `{SLOW}` loaded alone in {report.solo_load_s.get(True, math.nan):.2f} s (the load route's "
        f"answer: its weights read on a thread of their own, then warm-up passes on the inference thread, "
        f"{report.solo_warmup_s:.2f} s of it), unloaded; then loaded again while `m1` (idle) is unloaded at points "
        f"spread over the load. Then the same with the load's warm-up off (`parameters.config` "
        f'`{{"warmup": false}}`), alone in {report.solo_load_s.get(False, math.nan):.2f} s.',
        "",
        "| warm-up | unload sent after (s) | the load took (s) | of which warm-up (s) | the unload took (s) | "
        "ended while the load ran |",
        "|---|---|---|---|---|---|",
        *(
            f"| {'on' if t.warmup else 'off'} | {t.sent_s:.2f} | {t.load_s:.2f} | "
            f"{f'{t.warmup_s:.2f}' if t.warmup else '-'} | {t.unload_s:.2f} | {'yes' if t.beside else 'no'} |"
            for t in report.trials
        ),
    ]
    if report.first_failures:
        lines += ["", "First failures: " + "; ".join(report.first_failures)]
    lines += [
        "",
        "## Verdicts",
        "",
        *verdict_table(verdicts(report)),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model_control", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the default model in every role, tiny counts")
    parser.add_argument(
        "--slow-layers", type=int, default=SLOW_LAYERS, help="layers of the slow model (bert-base's width)"
    )
    parser.add_argument("--out", type=Path, default=None, help=f"write the report here too (e.g. {RESULTS})")
    raw = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(raw)
    args.load_before = os.getloadavg()
    plan = QUICK if args.quick else FULL
    small = default_model()
    if args.quick:
        models = {name: small.path for name in MODELS}
        slow, names = small.path, {SMALL: small.name, "m1": small.name, SLOW: small.name}
    else:
        models = {
            name: build_random_model(
                CACHE_DIR / f"bert-base-L{BUDGET_LAYERS}-seed{seed}", seed=seed, num_hidden_layers=BUDGET_LAYERS
            )
            for seed, name in enumerate(MODELS)
        }
        slow = build_random_model(CACHE_DIR / f"bert-base-L{args.slow_layers}", num_hidden_layers=args.slow_layers)
        names = {
            SMALL: small.name,
            "m1": f"(random, bert-base's width, {BUDGET_LAYERS} layers, seeds 0-2)",
            SLOW: f"(random, bert-base's width, {args.slow_layers} layers)",
        }
    refs = {name: references(path) for name, path in models.items()}
    report = Report()
    logs = CACHE_DIR / "logs"
    # The single server first: the budget of the workers' phase is built from the sizes it measured.
    measure_changes(small, models[MODELS[0]], slow, refs[MODELS[0]], plan, report, logs / "model-control.log")
    measure_budget(small, models, refs, plan, report, logs / "model-control-workers.log")
    command = ("python -m benchmarks.model_control " + shlex.join(raw)).strip()
    text = render(report, plan, args, command, names)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 1 if report.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
