"""Request handlers. They parse, queue and shape; they never touch torch."""

from __future__ import annotations

import time
from collections.abc import Sequence

from aiohttp import web

from .batcher import Answer
from .deadlines import request_deadline
from .keys import ANSWERS_KEY, BATCHER_KEY, METRICS_KEY, METRICS_PEERS_KEY, MODEL_KEY, PARSER_KEY, TRACE_KEY
from .metrics import merge_expositions
from .model_api import Query
from .schemas import shape_response
from .traces import NO_TRACE, RequestTrace


def timing_headers(answers: list[Answer]) -> dict[str, str]:
    """How the request was served; with several texts, the slowest text's figures."""
    return {
        "X-Queue-Time-Ms": f"{max(a.queued_s for a in answers) * 1000:.2f}",
        "X-Inference-Time-Ms": f"{max(a.inference_s for a in answers) * 1000:.2f}",
        "X-Batch-Size": str(max(a.batch_size for a in answers)),
    }


def request_trace(request: web.Request) -> RequestTrace:
    """The request's trace: the tracing stage's, or one that does nothing when tracing is off."""
    trace = request.get(TRACE_KEY)
    return NO_TRACE if trace is None else trace


async def answer(request: web.Request, queries: Sequence[Query], deadline: float) -> list[Answer]:
    """Queue a request's texts and wait for their answers: traced, and kept for the metrics."""
    trace = request_trace(request)
    queued_ns = time.time_ns()
    answers = await request.app[BATCHER_KEY].answer(queries, deadline, trace.link)
    trace.served(answers, queued_ns)
    request[ANSWERS_KEY] = answers
    return answers


async def fill_mask(request: web.Request) -> web.Response:
    """``POST /``: raw text or the Inference API's JSON in, the pipeline's JSON out."""
    deadline = request_deadline(request)
    parser = request.app[PARSER_KEY]
    with request_trace(request).step("maskserve.parse"):
        body = await request.read()
        parsed = parser.parse(body, request.content_type)
        queries = parser.queries(parsed, request.app[MODEL_KEY])
    answers = await answer(request, queries, deadline)
    return web.json_response(shape_response(parsed, [a.predictions for a in answers]), headers=timing_headers(answers))


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the app's Prometheus registry in the text exposition format.

    With ``--workers``, the whole server: every worker's series, labelled ``worker``; ``?scope=worker``
    asks for this process's alone (what the workers ask each other for).
    """
    body, content_type = request.app[METRICS_KEY].exposition()
    peers = request.app.get(METRICS_PEERS_KEY)
    if peers is not None and request.query.get("scope") != "worker":
        body = merge_expositions([(peers.worker, body), *await peers.expositions()])
    return web.Response(body=body, headers={"Content-Type": content_type})
