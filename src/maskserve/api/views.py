"""The API's handlers, `POST /` and `POST /score` (and their `/models/{name}` forms, for any served
model) and `GET /metrics`: they parse, ask the service and shape; never torch."""

from __future__ import annotations

import logging

from aiohttp import web

from maskserve.errors import ResponseTooLarge
from maskserve.observability.peers import merge_expositions
from maskserve.request.keys import service_of
from maskserve.request.run_task import (
    model_for_work,
    read_body,
    request_media_type,
    run_task,
    timing_headers,
    windows_header,
)
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask_request import FillMaskRequest, response_body
from maskserve.tasks.score_request import ScoreRequest, score_response_body
from maskserve.tasks.task import Ran

log = logging.getLogger(__name__)


def json_answer(limit: int, ran: Ran[FillMaskRequest, list[Answer]]) -> web.Response:
    """The pipeline's JSON for the texts' answers, joined from each text's own (no encoding here)."""
    body = response_body(ran.request, [a.json for a in ran.result])
    if len(body) > limit:
        # The parser's bound is an upper bound, so this is a bug; the limit holds regardless.
        log.error("an answer of %d bytes passed the bound of %d bytes; this is a bug", len(body), limit)
        raise ResponseTooLarge(f"the answer takes {len(body)} bytes, more than the limit of {limit}")
    headers = timing_headers(ran.rows) | windows_header(ran.windows)
    return web.Response(body=body, content_type="application/json", headers=headers)


async def fill_mask(request: web.Request) -> web.Response:
    """``POST /`` (the default model) and ``POST /models/{name}``: raw text or the Inference API's
    JSON in, the pipeline's JSON out. The circuit-breaking stage has admitted it at the door; the
    service admits it again on its cost."""
    served = await model_for_work(request)

    async def read() -> FillMaskRequest:
        return served.parser.parse(await read_body(request), request_media_type(request))

    return json_answer(served.settings.max_response_bytes, await run_task(request, served, served.fill_mask, read))


async def score(request: web.Request) -> web.Response:
    """``POST /score`` and ``POST /models/{name}/score``: each text's pseudo-log-likelihood. Its masked
    copies are fill-mask queries, admitted on their whole cost and batched with every other text."""
    served = await model_for_work(request)

    async def read() -> ScoreRequest:
        return served.score_parser.parse(await read_body(request), request_media_type(request))

    ran = await run_task(request, served, served.score, read)
    return web.Response(
        body=score_response_body(ran.request, ran.result, ran.windows),
        content_type="application/json",
        headers=timing_headers(ran.rows) | windows_header(ran.windows),
    )


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the app's Prometheus registry in the text exposition format.

    With ``--workers``, the whole server: every worker's series, labelled ``worker``; ``?scope=worker``
    asks for this process's alone (what the workers ask each other for).
    """
    service = service_of(request.app)
    body, content_type = service.metrics.exposition()
    if service.peers is not None and request.query.get("scope") != "worker":
        body = merge_expositions([(service.peers.worker, body), *await service.peers.expositions()])
    return web.Response(body=body, headers={"Content-Type": content_type})
