"""Where one request's time goes at concurrency 1, socket to socket, against one offline pipeline call.

Two views of the same sentences, one at a time:

- **in the engine** (no server): tokenizing, the forward pass at the masks, and the rest of
  ``predict`` (softmax, top-k, filling in each candidate's ``sequence``), beside one call of
  ``transformers.pipeline("fill-mask")`` on the same text;
- **through the server**: the real app on a loopback port, a keep-alive client sending one request
  at a time. The client times the round trip; the tracing stage (in-memory exporter) times the
  request's HTTP span and its children (parse: read + validate + tokenize; queue: queued to the
  start of the forward pass; inference: the forward pass on the inference thread). What is left of
  the HTTP span is the batch loop's hand-back and the answer's JSON; what is left of the round trip
  is HTTP parsing, the socket and the client.

Run by hand: ``python -m benchmarks.profile_request [--model default|bert-base] [--requests N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import maskserve.observability.tracing
from maskserve.config.cpus import available_cpus
from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.http.app import create_app, inference_thread, load_model
from maskserve.middleware.request_tracing import TRACING_KEY
from maskserve.model_api import Query

from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .offline import load_pipeline
from .sentences import make_sentences


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1000


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def engine_steps(engine: FillMaskEngine, texts: Sequence[str]) -> dict[str, float]:
    """Median milliseconds of each step of one text in the engine; run it on the inference thread."""
    steps: dict[str, list[float]] = {"tokenize": [], "forward": [], "predict": []}
    for text in texts:
        steps["tokenize"].append(timed(lambda text=text: engine.encode(text)))
        query = Query(input_ids=engine.encode(text), top_k=5)
        ids, mask = engine._pad([query.input_ids])
        rows, cols = np.nonzero(ids == engine.mask_token_id)
        forward = (ids, mask, rows, cols)
        steps["forward"].append(timed(lambda forward=forward: engine._mask_logits(*forward)))
        steps["predict"].append(timed(lambda query=query: engine.predict([query])))
    return {name: median_ms(values) for name, values in steps.items()}


def pipeline_call(pipe: Any, texts: Sequence[str]) -> float:
    """Median milliseconds of one ``pipeline(text)`` call, on the thread that loaded it."""
    return median_ms([timed(lambda text=text: pipe(text, top_k=5)) for text in texts])


async def server_view(
    engine: FillMaskEngine, thread: ThreadPoolExecutor, texts: Sequence[str], rounds: int, traced: bool
) -> dict[str, float]:
    """Median milliseconds of the round trip and, when ``traced``, of each span of the request."""
    exporter = InMemorySpanExporter()
    maskserve.observability.tracing.exporter_factories = lambda names: [lambda: exporter]  # type: ignore[assignment]
    settings = Settings(port=0, traces_exporter="console" if traced else None)
    app = create_app(settings, engine=engine, thread=thread)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    round_trips: list[float] = []
    try:
        async with aiohttp.ClientSession() as session:
            for text in texts[:3]:  # warm the connection, the thread policy and the cost model
                async with session.post(url, data=text) as response:
                    await response.read()
            if traced:
                app[TRACING_KEY].tracing.provider.force_flush()
                exporter.clear()
            for _ in range(rounds):
                for text in texts:
                    started = time.perf_counter()
                    async with session.post(url, data=text) as response:
                        await response.read()
                    round_trips.append(time.perf_counter() - started)
        figures = {"round trip": median_ms(round_trips)}
        if traced:
            app[TRACING_KEY].tracing.provider.force_flush()
            figures |= span_figures(list(exporter.get_finished_spans()))
        return figures
    finally:
        await runner.cleanup()


def span_figures(spans: list[ReadableSpan]) -> dict[str, float]:
    """Median milliseconds of the HTTP span, its children, and what the children leave of it."""
    by_parent: dict[int, dict[str, float]] = {}
    http: dict[int, float] = {}
    for span in spans:
        assert span.start_time is not None and span.end_time is not None and span.context is not None
        seconds = (span.end_time - span.start_time) / 1e9
        if span.kind is SpanKind.SERVER:
            http[span.context.span_id] = seconds
        elif span.parent is not None:
            by_parent.setdefault(span.parent.span_id, {})[span.name] = seconds
    rows: dict[str, list[float]] = {"http span": [], "parse": [], "queue": [], "inference": [], "hand-back + JSON": []}
    for span_id, total in http.items():
        children = by_parent.get(span_id, {})
        parse = children.get("maskserve.parse", 0.0)
        queue = children.get("maskserve.queue", 0.0)
        inference = children.get("maskserve.inference", 0.0)
        for name, value in (
            ("http span", total),
            ("parse", parse),
            ("queue", queue),
            ("inference", inference),
            ("hand-back + JSON", total - parse - queue - inference),
        ):
            rows[name].append(value)
    return {name: median_ms(values) for name, values in rows.items()}


def load(model: BenchModel, backend: str) -> tuple[FillMaskEngine, ThreadPoolExecutor]:
    """The engine as ``maskserve --backend <backend>`` loads it (default threads, on its inference
    thread), and that thread."""
    settings = Settings(model=(str(model.path),), backend=backend, cache_dir=str(CACHE_DIR / "maskserve-cache"))
    thread = inference_thread()
    engine = thread.submit(load_model, settings).result()
    assert isinstance(engine, FillMaskEngine)
    return engine, thread


def profile(model: BenchModel, requests: int, backend: str) -> str:
    texts = make_sentences(requests)
    engine, thread = load(model, backend)
    pipe = load_pipeline(str(model.path))
    offline = {**thread.submit(engine_steps, engine, texts).result(), "pipeline": pipeline_call(pipe, texts)}
    plain = asyncio.run(server_view(engine, thread, texts, rounds=1, traced=False))
    traced = asyncio.run(server_view(engine, thread, texts, rounds=1, traced=True))
    lines = [
        f"#### {model.name}, --backend {backend}: {requests} sentences one at a time, {available_cpus()} CPUs, "
        "medians in ms",
        "",
        "| step | ms |",
        "| --- | --- |",
        f"| one offline `pipeline(text)` call | {offline['pipeline']:.2f} |",
        f"| engine: tokenize | {offline['tokenize']:.2f} |",
        f"| engine: forward pass at the masks | {offline['forward']:.2f} |",
        f"| engine: whole `predict` (forward + softmax, top-k, sequences) | {offline['predict']:.2f} |",
        f"| server: round trip, tracing off | {plain['round trip']:.2f} |",
        f"| server: round trip, tracing on | {traced['round trip']:.2f} |",
    ]
    for name in ("http span", "parse", "queue", "inference", "hand-back + JSON"):
        lines.append(f"| traced: {name} | {traced[name]:.2f} |")
    lines.append(
        f"| HTTP, socket and client (round trip - http span) | {traced['round trip'] - traced['http span']:.2f} |"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", choices=("default", "bert-base"), action="append")
    parser.add_argument("--backend", choices=("torch", "onnxruntime"), action="append")
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args(argv)
    builders = {"default": default_model, "bert-base": bert_base_model}
    for name in args.model or ["default", "bert-base"]:
        for backend in args.backend or ["torch"]:
            print(profile(builders[name](), args.requests if name == "default" else min(args.requests, 24), backend))
            print()


if __name__ == "__main__":
    main()
