"""Request handlers. They parse, queue and shape; they never touch torch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from aiohttp import web

from .batcher import Answer, Work
from .deadlines import request_deadline
from .errors import ResponseTooLarge
from .keys import (
    ANSWERS_KEY,
    BATCHER_KEY,
    BREAKER_KEY,
    METRICS_KEY,
    METRICS_PEERS_KEY,
    MODEL_KEY,
    PARSER_KEY,
    SETTINGS_KEY,
    TOKENIZER_KEY,
    TRACE_KEY,
)
from .metrics import merge_expositions
from .model_api import Query
from .schemas import FillMaskRequest, response_body
from .traces import NO_TRACE, RequestTrace

log = logging.getLogger(__name__)

# Texts up to this many characters in all are tokenized on the event loop: a hop to the tokenizer
# thread costs more than they do. Longer ones go to that thread, where the tokenizer releases the
# interpreter lock, so no request's texts can hold the event loop (and /livez) for long.
INLINE_TOKENIZE_CHARS = 512


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


async def to_queries(request: web.Request, parsed: FillMaskRequest) -> list[Query]:
    """Tokenize and check a parsed request's texts (a 4xx names the first problem), off the event
    loop unless they are short."""
    app = request.app
    parser, model = app[PARSER_KEY], app[MODEL_KEY]
    if sum(len(text) for text in parsed.texts) <= INLINE_TOKENIZE_CHARS:
        return parser.queries(parsed, model)
    return await asyncio.get_running_loop().run_in_executor(app[TOKENIZER_KEY], parser.queries, parsed, model)


async def answer(request: web.Request, queries: Sequence[Query], deadline: float) -> list[Answer]:
    """Admit a request on its whole cost, queue its texts and wait for their answers: traced, and
    kept for the metrics."""
    app = request.app
    time_left = deadline - asyncio.get_running_loop().time()
    app[BREAKER_KEY].admit(Work.of(queries), time_left, app[SETTINGS_KEY].request_timeout)
    trace = request_trace(request)
    queued_ns = time.time_ns()
    answers = await app[BATCHER_KEY].answer(queries, deadline, trace.link)
    trace.served(answers, queued_ns)
    request[ANSWERS_KEY] = answers
    return answers


def json_answer(request: web.Request, parsed: FillMaskRequest, answers: Sequence[Answer]) -> web.Response:
    """The pipeline's JSON for ``answers``, joined from each text's own (no encoding here)."""
    body = response_body(parsed, [a.json for a in answers])
    limit = request.app[SETTINGS_KEY].max_response_bytes
    if len(body) > limit:
        # The parser's bound is an upper bound, so this is a bug; the limit holds regardless.
        log.error("an answer of %d bytes passed the bound of %d bytes; this is a bug", len(body), limit)
        raise ResponseTooLarge(f"the answer takes {len(body)} bytes, more than the limit of {limit}")
    return web.Response(body=body, content_type="application/json", headers=timing_headers(list(answers)))


async def fill_mask(request: web.Request) -> web.Response:
    """``POST /``: raw text or the Inference API's JSON in, the pipeline's JSON out."""
    deadline = request_deadline(request)
    parser = request.app[PARSER_KEY]
    with request_trace(request).step("maskserve.parse"):
        body = await request.read()
        parsed = parser.parse(body, request.content_type)
        queries = await to_queries(request, parsed)
    answers = await answer(request, queries, deadline)
    return json_answer(request, parsed, answers)


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
