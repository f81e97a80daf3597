"""tritonclient's gRPC client against its HTTP client and ``POST /``: one server, the same texts.

    python -m benchmarks.grpc            # the canned server, both models, 5 rounds: 4 minutes on 2 cores
    python -m benchmarks.grpc --quick    # the canned server and the default model, tiny counts: for the test

One maskserve process per model, started with ``--grpc-port``, answers three clients, each the
asyncio client a pipeline calling at volume would use, one per protocol on this process's loop:

- **gRPC ModelInfer**: ``tritonclient.grpc.aio`` (one channel), the text a BYTES tensor of shape [1];
- **REST infer route**: ``tritonclient.http.aio`` on ``POST /v2/models/{model}/infer``, its default
  binary tensors in and out;
- **POST /**: an aiohttp session, the text as the raw body.

Every request carries one text of sentences.py's mix; a request's time runs from the call to its
predictions decoded from JSON, and every answer is checked against the offline pipeline's for its
own text. In each round, concurrency 1 is interleaved (each text sent by every client in turn, the
order rotating from text to text, so drift hits all three alike and each text gives a paired
difference), then each client runs 64 closed-loop callers for a fixed request count, the clients'
order rotating from round to round. The machine is shared and has 2 cores that the server and the
clients share: the ratios are taken inside each round, and the report gives each client's and the
server's CPU per request at c=64, to tell where a difference comes from.

**The protocols alone.** Before the models, the same clients and rounds meet a canned server: a
``grpc.aio`` server and an aiohttp one in one process and one loop, answering every request with
one fixed answer (the pipeline's for the first text), no model and no maskserve request path. Its
figures are what each protocol's client and server cost by themselves on this machine, the floor
under maskserve's difference between them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import importlib.metadata
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import tritonclient.grpc.aio as triton_grpc
import tritonclient.http.aio as triton_http
from tritonclient.utils import InferenceServerException

from maskserve.config.cpus import available_cpus

from . import offline
from .agreement import cpu_line
from .load import Expected, LoadResult, percentile
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .run import cpu_model, load_averages, log, publish
from .sentences import make_sentences
from .servers import Server, free_port, maskserve_argv

RESULTS = Path(__file__).resolve().parent / "results" / "grpc.md"
MODEL_NAME = "maskserve"  # the served name of a server's one model (--model-name's default)
CANNED = "canned"  # the plan's key for the protocols alone
GRPC = "gRPC ModelInfer"
REST = "REST infer route"
POST = "POST /"
SYSTEMS = (GRPC, REST, POST)
CLIENTS = {
    GRPC: "`tritonclient.grpc.aio`, one channel",
    REST: "`tritonclient.http.aio`, `POST /v2/models/maskserve/infer`, binary tensors",
    POST: "aiohttp, the text as the raw body",
}
CONCURRENCY = 64
# The targets, on the default model: gRPC against the REST infer route, in one run.
TARGET_RPS = 1.0  # gRPC's req/s at c=64 / REST's, at least
TARGET_P50 = 1.0  # gRPC's p50 at c=1 / REST's, at most
# A failure is a reply the client could not use; each kind of one is counted, not raised.
FAILURES = (InferenceServerException, aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError)


@dataclass(frozen=True)
class Counts:
    """One model's requests per client and round."""

    c1: int  # concurrency 1, interleaved
    c64: int  # the closed loop at c=64
    warmup: int  # at c=64, per client, before the rounds


@dataclass(frozen=True)
class Plan:
    rounds: int
    models: tuple[str, ...]
    counts: dict[str, Counts]
    mix: int  # distinct texts
    time_cap_s: float  # per closed loop


FULL = Plan(
    rounds=5,
    models=(CANNED, "default", "bert-base"),
    counts={CANNED: Counts(256, 4096, 512), "default": Counts(128, 1536, 256), "bert-base": Counts(48, 192, 128)},
    mix=128,
    time_cap_s=120.0,
)
QUICK = Plan(
    rounds=1,
    models=(CANNED, "default"),
    counts={CANNED: Counts(8, 128, 64), "default": Counts(8, 128, 64), "bert-base": Counts(4, 64, 64)},
    mix=32,
    time_cap_s=60.0,
)
MODELS: dict[str, Callable[[], BenchModel]] = {"default": default_model, "bert-base": bert_base_model}


# -- the clients ------------------------------------------------------------------------------


Send = Callable[[str], Awaitable[Any]]


@dataclass
class Client:
    """One protocol's client: ``send`` returns one text's predictions, decoded."""

    name: str
    send: Send
    close: Callable[[], Awaitable[None]]
    opened: float = field(default_factory=time.monotonic)  # a failure is dated from here


def _predictions(result: Any) -> Any:
    """The one text's predictions from a tritonclient result (either transport's)."""
    return json.loads(result.as_numpy("predictions")[0])


def _triton_client(name: str, triton: Any, address: str) -> Client:
    """tritonclient's asyncio client of either transport (``triton``: its module), one text a request."""
    client = triton.InferenceServerClient(address)

    async def send(text: str) -> Any:
        tensor = triton.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode("utf-8")], dtype=object))
        return _predictions(await client.infer(MODEL_NAME, [tensor]))

    return Client(name, send, client.close)


async def grpc_client(address: str) -> Client:
    return _triton_client(GRPC, triton_grpc, address)


async def rest_client(address: str) -> Client:
    return _triton_client(REST, triton_http, address)


async def post_client(address: str) -> Client:
    # As many connections as callers, as tritonclient.http's pool gives them (up to 100).
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))
    url = f"http://{address}/"

    async def send(text: str) -> Any:
        async with session.post(url, data=text.encode("utf-8")) as response:
            body = await response.read()
            if response.status != 200:
                raise ValueError(f"{response.status}: {body[:120]!r}")
        return json.loads(body)

    return Client(POST, send, session.close)


# -- one measurement --------------------------------------------------------------------------


def _failure(error: BaseException) -> str:
    """A failure's kind for the statuses column: tritonclient's status where it says one."""
    status = error.status() if isinstance(error, InferenceServerException) else None
    return f"{type(error).__name__}: {status}" if status else type(error).__name__


async def _call(client: Client, texts: Sequence[str], expected: Sequence[Expected], k: int, result: LoadResult) -> None:
    """Send text ``k`` and record its latency, status and whether the answer is its text's."""
    result.sent += 1
    started = time.perf_counter()
    try:
        answer = await client.send(texts[k])
    except FAILURES as error:
        result.statuses[_failure(error)] += 1
        result.fail(time.monotonic() - client.opened, f"text {k}: {_failure(error)}: {str(error)[:160]}")
        return
    result.latencies_ms.append((time.perf_counter() - started) * 1000)
    result.statuses["ok"] += 1
    result.count_answer(answer, expected[k], time.monotonic() - client.opened, f"text {k}")


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time (/proc/<pid>/stat), every thread."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Loop:
    """One client's closed loop: the load, and the CPU the client (this process) and the server spent."""

    load: LoadResult
    client_cpu_s: float
    server_cpu_s: float

    def per_request_ms(self, seconds: float) -> float:
        return 1000 * seconds / self.load.sent if self.load.sent else float("nan")


async def closed_loop(
    client: Client,
    texts: Sequence[str],
    expected: Sequence[Expected],
    *,
    requests: int,
    time_cap_s: float,
    server_pid: int,
    offset: int = 0,
) -> Loop:
    """``requests`` requests by :data:`CONCURRENCY` callers on one client, text ``offset + i`` for the
    i-th; nothing is sent after ``time_cap_s``."""
    result = LoadResult(CONCURRENCY)
    counter = itertools.count()
    loop = asyncio.get_running_loop()

    async def caller(stop_at: float) -> None:
        while (i := next(counter)) < requests:
            if loop.time() >= stop_at:
                result.capped = True
                return
            await _call(client, texts, expected, (offset + i) % len(texts), result)

    client_cpu, server_cpu = time.process_time(), cpu_seconds(server_pid)
    begun = loop.time()
    await asyncio.gather(*(caller(begun + time_cap_s) for _ in range(CONCURRENCY)))
    result.duration_s = loop.time() - begun
    return Loop(result, time.process_time() - client_cpu, cpu_seconds(server_pid) - server_cpu)


async def interleaved(
    clients: Sequence[Client], texts: Sequence[str], expected: Sequence[Expected], *, requests: int, offset: int
) -> dict[str, LoadResult]:
    """Concurrency 1: each of ``requests`` texts sent by every client in turn, the order rotating."""
    results = {client.name: LoadResult(1) for client in clients}
    begun = time.perf_counter()
    for i in range(requests):
        k = (offset + i) % len(texts)
        shift = i % len(clients)
        for client in [*clients[shift:], *clients[:shift]]:
            await _call(client, texts, expected, k, results[client.name])
    for result in results.values():
        result.duration_s = time.perf_counter() - begun
    return results


# -- a run ------------------------------------------------------------------------------------


@dataclass
class Round:
    c1: dict[str, LoadResult]
    c64: dict[str, Loop]

    def rps_ratio(self, a: str, b: str) -> float:
        return self.c64[a].load.rps / self.c64[b].load.rps

    def p50_ratio(self, a: str, b: str) -> float:
        return self.c1[a].p(50) / self.c1[b].p(50)

    def paired_ms(self, a: str, b: str) -> list[float]:
        """Per text at c=1, ``a``'s latency minus ``b``'s; none where either failed a text (the
        latencies are of answers only, and would no longer pair up)."""
        if self.c1[a].failed or self.c1[b].failed:
            return []
        return [x - y for x, y in zip(self.c1[a].latencies_ms, self.c1[b].latencies_ms)]


@dataclass
class ModelRun:
    key: str
    model: BenchModel
    counts: Counts
    rounds: list[Round] = field(default_factory=list)
    # maskserve's /metrics at the end: connections the server closed, by reason (an idle keep-alive
    # connection closed as a client takes it from its pool fails that request).
    closed: dict[str, float] = field(default_factory=dict)


async def measure_model(
    run_: ModelRun, plan: Plan, texts: Sequence[str], expected: Sequence[Expected], server: Server, grpc_port: int
) -> None:
    http_address, grpc_address = f"127.0.0.1:{server.port}", f"127.0.0.1:{grpc_port}"
    clients = [await grpc_client(grpc_address), await rest_client(http_address), await post_client(http_address)]
    counts = run_.counts
    try:
        for client in clients:  # connections open, the server's shapes seen, before anything is timed
            warm = await closed_loop(
                client, texts, expected, requests=counts.warmup, time_cap_s=plan.time_cap_s, server_pid=server.pid
            )
            if warm.load.correct != warm.load.sent:
                raise RuntimeError(f"{client.name} failed in the warm-up: {warm.load.failures[:3]}")
        for number in range(plan.rounds):
            offset = number * counts.c1
            c1 = await interleaved(clients, texts, expected, requests=counts.c1, offset=offset)
            c64: dict[str, Loop] = {}
            turn = number % len(clients)
            for client in [*clients[turn:], *clients[:turn]]:
                c64[client.name] = await closed_loop(
                    client,
                    texts,
                    expected,
                    requests=counts.c64,
                    time_cap_s=plan.time_cap_s,
                    server_pid=server.pid,
                    offset=offset,
                )
            round_ = Round(c1, c64)
            run_.rounds.append(round_)
            log(
                f"  round {number + 1}/{plan.rounds}: c=64 req/s "
                + ", ".join(f"{name} {c64[name].load.rps:.1f}" for name in SYSTEMS)
                + "; c=1 p50 ms "
                + ", ".join(f"{name} {c1[name].p(50):.2f}" for name in SYSTEMS)
            )
    finally:
        for client in clients:
            await client.close()


def two_ports() -> tuple[int, int]:
    """Two free ports, never the same one twice (maskserve refuses --port equal to --grpc-port)."""
    http = free_port()
    while (rpc := free_port()) == http:
        pass
    return http, rpc


def run_model(key: str, plan: Plan, log_dir: Path) -> ModelRun:
    texts = make_sentences(plan.mix)
    if key == CANNED:
        return run_canned(plan, texts, log_dir)
    model = MODELS[key]()
    pipe = offline.load_pipeline(str(model.path))
    expected, _ = offline.reference_answers(pipe, texts)
    del pipe
    port, grpc_port = two_ports()
    argv = maskserve_argv(model.path, port, "--grpc-port", str(grpc_port))
    run_ = ModelRun(key, model, plan.counts[key])
    with Server(f"maskserve ({key})", argv, port, log_dir / f"maskserve-{key}.log") as server:
        log(f"{model.name}: maskserve on HTTP {port}, gRPC {grpc_port}")
        asyncio.run(measure_model(run_, plan, texts, expected, server, grpc_port))
        run_.closed = closed_connections(server)
    return run_


def closed_connections(server: Server) -> dict[str, float]:
    """``maskserve_closed_connections_total`` by reason, from the server's ``/metrics``."""
    with urllib.request.urlopen(f"{server.url}metrics", timeout=30) as response:
        text = response.read().decode("utf-8")
    found = re.findall(r'^maskserve_closed_connections_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    return {reason: float(value) for reason, value in found}


def run_canned(plan: Plan, texts: Sequence[str], log_dir: Path) -> ModelRun:
    """The same clients and rounds against :func:`serve_canned`: every text answered with the
    pipeline's answer to the first, which is then every text's expected answer."""
    model = default_model()
    answer = offline.load_pipeline(str(model.path))(texts[0], top_k=5)
    expected = [{p["token"]: p["sequence"] for p in answer}] * len(texts)
    log_dir.mkdir(parents=True, exist_ok=True)
    answer_file = log_dir / "canned-answer.json"
    answer_file.write_text(json.dumps(answer), encoding="utf-8")
    port, grpc_port = two_ports()
    argv = [sys.executable, "-m", "benchmarks.grpc", "--canned-server", f"{port},{grpc_port},{answer_file}"]
    run_ = ModelRun(CANNED, BenchModel("The protocols alone: a canned server", Path()), plan.counts[CANNED])
    with Server("canned server", argv, port, log_dir / "canned.log") as server:
        log(f"canned server on HTTP {port}, gRPC {grpc_port}")
        asyncio.run(measure_model(run_, plan, texts, expected, server, grpc_port))
    return run_


async def serve_canned(http_port: int, grpc_port: int, answer: bytes) -> None:
    """``ModelInfer``, the REST infer route and ``POST /``, each answering ``answer`` for any request,
    as maskserve frames it (raw or binary tensors; JSON for ``POST /``), on one loop; until killed."""
    import grpc
    from aiohttp import web
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from maskserve.tasks.oip_tensors import HEADER_LENGTH, encode_bytes_tensor

    blob = encode_bytes_tensor([answer])
    reply = service_pb2.ModelInferResponse(model_name=MODEL_NAME, model_version="1")
    reply.outputs.add(name="predictions", datatype="BYTES", shape=[1])
    reply.raw_output_contents.append(blob)
    output = {"name": "predictions", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(blob)}}
    header = json.dumps({"model_name": MODEL_NAME, "model_version": "1", "outputs": [output]}).encode()

    class Canned(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
        async def ModelInfer(self, request: Any, context: Any) -> Any:
            return reply

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
        return web.Response(body=header + blob, headers=headers)

    async def post(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    rpc = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Canned(), rpc)
    rpc.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await rpc.start()
    app = web.Application()
    app.router.add_post(f"/v2/models/{MODEL_NAME}/infer", infer)
    app.router.add_post("/", post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port).start()
    await asyncio.Event().wait()


@dataclass
class GrpcRun:
    plan: Plan
    models: list[ModelRun]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def run(plan: Plan, log_dir: Path = CACHE_DIR / "logs" / "grpc") -> GrpcRun:
    load_before = os.getloadavg()
    models = [run_model(key, plan, log_dir) for key in plan.models]
    return GrpcRun(plan, models, load_before, os.getloadavg())


# -- the report -------------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """The median, and the range when the values differ."""
    if not values:
        return "–"
    low, mid, high = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return mid if low == high else f"{mid} ({low}–{high})"


def ratio_line(values: Sequence[float], verdict_: str = "") -> str:
    """The median ratio and each round's; ``verdict_`` closes the parenthesis (``target ≥ 1×): PASS``)."""
    per_round = ", ".join(f"{v:.2f}" for v in values)
    return f"**{statistics.median(values):.2f}×** (per round {per_round}" + (f"; {verdict_}" if verdict_ else ")")


def verdict(met: bool) -> str:
    return "PASS" if met else "FAIL"


def versions() -> str:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        revision = "unknown"
    names = ("tritonclient", "grpcio", "protobuf", "aiohttp", "numpy", "torch", "transformers")
    return f"maskserve {version('maskserve')} at {revision}, Python {platform.python_version()}, " + ", ".join(
        f"{name} {version(name)}" for name in names
    )


def _statuses(loads: Sequence[LoadResult]) -> str:
    total = sum((load.statuses for load in loads), Counter[str]())
    return ", ".join(f"{k}: {v}" for k, v in sorted(total.items()))


def gaps(run_: ModelRun) -> tuple[float, float, float]:
    """gRPC minus the REST infer route: per request at c=64, the server's and the client's CPU ms
    (medians of the rounds); and at c=1, the median per-text latency difference."""
    server = [
        r.c64[GRPC].per_request_ms(r.c64[GRPC].server_cpu_s) - r.c64[REST].per_request_ms(r.c64[REST].server_cpu_s)
        for r in run_.rounds
    ]
    client = [
        r.c64[GRPC].per_request_ms(r.c64[GRPC].client_cpu_s) - r.c64[REST].per_request_ms(r.c64[REST].client_cpu_s)
        for r in run_.rounds
    ]
    paired = [d for r in run_.rounds for d in r.paired_ms(GRPC, REST)]
    return (
        statistics.median(server),
        statistics.median(client),
        statistics.median(paired) if paired else float("nan"),
    )


def gap_line(run_: ModelRun, canned: ModelRun | None) -> str:
    server, client, paired = gaps(run_)
    line = (
        f"- gRPC minus the REST infer route, per request: server CPU {server:+.2f} ms and client CPU "
        f"{client:+.2f} ms at c={CONCURRENCY}, latency {paired:+.2f} ms at c=1"
    )
    if canned is None or run_ is canned:
        return line
    server_alone, client_alone, paired_alone = gaps(canned)
    return (
        f"{line}; the protocols alone (the canned server): {server_alone:+.2f} ms, {client_alone:+.2f} ms and "
        f"{paired_alone:+.2f} ms"
    )


def model_section(run_: ModelRun, *, targets: bool, canned: ModelRun | None = None) -> list[str]:
    rounds, counts = run_.rounds, run_.counts
    server = (
        "`python -m benchmarks.grpc --canned-server ...`: a `grpc.aio` server and an aiohttp one on one loop in "
        "one process, answering every request with the pipeline's answer to the first text, framed as maskserve "
        "frames it; no model, no maskserve request path."
        if run_.key == CANNED
        else "`python -m maskserve --model MODEL --port PORT --grpc-port PORT` (every other flag at its default)."
    )
    lines = [
        f"## {run_.model.name}",
        "",
        f"{server} Per client and round: {counts.c1} requests at c=1 (interleaved), {counts.c64} at c={CONCURRENCY}; "
        f"{counts.warmup} at c={CONCURRENCY} per client before the rounds; rounds: {len(rounds)}.",
        "",
        f"| client | c=1 p50 ms | c=1 p99 ms | c={CONCURRENCY} req/s | c={CONCURRENCY} p50 ms | "
        f"c={CONCURRENCY} p99 ms | client CPU ms/req | server CPU ms/req | answers | wrong or failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in SYSTEMS:
        c1 = [r.c1[name] for r in rounds]
        c64 = [r.c64[name] for r in rounds]
        c1_ms = [ms for load in c1 for ms in load.latencies_ms]
        c64_ms = [ms for loop in c64 for ms in loop.load.latencies_ms]
        failed = sum(load.failed for load in (*c1, *(loop.load for loop in c64)))
        lines.append(
            f"| {name} | {percentile(c1_ms, 50):.2f} | {percentile(c1_ms, 99):.2f} | "
            f"{spread([loop.load.rps for loop in c64])} | "
            f"{percentile(c64_ms, 50):.1f} | {percentile(c64_ms, 99):.1f} | "
            f"{spread([loop.per_request_ms(loop.client_cpu_s) for loop in c64], '{:.2f}')} | "
            f"{spread([loop.per_request_ms(loop.server_cpu_s) for loop in c64], '{:.2f}')} | "
            f"{_statuses([*c1, *(loop.load for loop in c64)])} | {failed} |"
        )
    rps = [r.rps_ratio(GRPC, REST) for r in rounds]
    p50 = [r.p50_ratio(GRPC, REST) for r in rounds]
    paired = [d for r in rounds for d in r.paired_ms(GRPC, REST)]
    rps_met, p50_met = statistics.median(rps) >= TARGET_RPS, statistics.median(p50) <= TARGET_P50
    if targets:
        rps_verdict = f"target ≥ {TARGET_RPS:g}×): {verdict(rps_met)}"
        p50_verdict = f"target ≤ {TARGET_P50:g}×): {verdict(p50_met)}"
    elif run_.key == CANNED:
        rps_verdict = p50_verdict = "no target: the protocols alone)"
    else:
        rps_verdict = p50_verdict = "the targets are the default model's)"
    lines += [
        "",
        "Ratios, the median of the per-round ratios:",
        "",
        f"- gRPC / REST infer route, req/s at c={CONCURRENCY}: {ratio_line(rps, rps_verdict)}",
        f"- gRPC / REST infer route, p50 at c=1: {ratio_line(p50, p50_verdict)}; per text, gRPC's latency "
        f"minus REST's: median {_paired(paired)}",
        f"- gRPC / POST /: req/s at c={CONCURRENCY} {ratio_line([r.rps_ratio(GRPC, POST) for r in rounds])}, "
        f"p50 at c=1 {ratio_line([r.p50_ratio(GRPC, POST) for r in rounds])}",
        f"- REST infer route / POST /: req/s at c={CONCURRENCY} "
        f"{ratio_line([r.rps_ratio(REST, POST) for r in rounds])}, "
        f"p50 at c=1 {ratio_line([r.p50_ratio(REST, POST) for r in rounds])}",
        gap_line(run_, canned),
        *failure_lines(run_),
        "",
    ]
    return lines


def failure_lines(run_: ModelRun) -> list[str]:
    """Each client's first failures, dated from its opening, and the connections the server closed."""
    lines = []
    for name in SYSTEMS:
        loads = [*(r.c1[name] for r in run_.rounds), *(r.c64[name].load for r in run_.rounds)]
        failures = sorted((f for load in loads for f in load.failures), key=lambda f: float(f.split("s:", 1)[0]))
        if failures:
            lines.append(f"- {name}'s first failures (seconds since the client opened): {'; '.join(failures[:3])}")
    closed = ", ".join(f"{reason} {value:.0f}" for reason, value in sorted(run_.closed.items()) if value)
    if run_.closed:
        lines.append(f"- connections the server closed (`/metrics`): {closed or 'none'}")
    return lines


def render(result: GrpcRun, command: str) -> str:
    plan = result.plan
    lines = [
        "# gRPC (tritonclient) against REST: the same server, texts and loop",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; machine: {cpu_model()}, nproc {available_cpus()} "
        f"(os.cpu_count {os.cpu_count()}); load average (1/5/15 min) {load_averages(result.load_before)} before, "
        f"{load_averages(result.load_after)} after",
        f"- {cpu_line()}",
        f"- versions: {versions()}",
        "- clients, in this process on one asyncio loop, one per protocol: "
        + "; ".join(f"{name}: {how}" for name, how in CLIENTS.items()),
        f"- texts: sentences.py's mix, {plan.mix} distinct, one text a request, the same for every client; a "
        "request's time runs from the call to its predictions decoded from JSON; every answer checked against "
        "the offline pipeline's for its own text",
        f"- each round: c=1 interleaved (each text sent by every client in turn, the order rotating per text), "
        f"then c={CONCURRENCY} closed-loop callers per client (the order rotating per round); the server and the "
        "clients share the machine's cores; CPU ms/req: this process's and the server's CPU time over the "
        f"c={CONCURRENCY} loop, per request",
        "",
    ]
    canned = next((run_ for run_ in result.models if run_.key == CANNED), None)
    for run_ in result.models:
        lines += model_section(run_, targets=run_.key == "default", canned=canned)
    return "\n".join(lines) + "\n"


def _paired(differences: Sequence[float]) -> str:
    return f"{statistics.median(differences):+.2f} ms" if differences else "– (a client failed a text)"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpc", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the canned server and the default model, tiny counts")
    parser.add_argument("--rounds", type=int, default=0, help="override the plan's round count")
    parser.add_argument("--models", default="", help="comma-separated: canned, default, bert-base")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--canned-server", default="", help=argparse.SUPPRESS)  # HTTP_PORT,GRPC_PORT,ANSWER_FILE
    args = parser.parse_args(args_list)
    if args.canned_server:
        http_port, grpc_port, answer_file = args.canned_server.split(",", 2)
        answer = Path(answer_file).read_bytes()
        asyncio.run(serve_canned(int(http_port), int(grpc_port), answer))
        return 0
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    if args.models:
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
        if unknown := [m for m in models if m not in (*MODELS, CANNED)]:
            raise SystemExit(f"--models: unknown {unknown}; choose from {[CANNED, *MODELS]}")
        plan = dataclasses.replace(plan, models=models)
    result = run(plan)
    publish(render(result, " ".join(["python -m benchmarks.grpc", *args_list])), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
