"""The API's handlers, `POST /` and `POST /score` (and their `/models/{name}` forms, for any served
model) and `GET /metrics`: they parse, ask the service and shape; never torch."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiohttp import web

from .errors import ResponseTooLarge
from .handling import answer, read_body, request_media_type, served_model, text_answers, timing_headers
from .keys import service_of, state_of
from .metrics import merge_expositions
from .schemas import FillMaskRequest, response_body
from .score_schemas import score_response_body
from .scoring import text_scores
from .work_queue import Answer

log = logging.getLogger(__name__)


def json_answer(limit: int, parsed: FillMaskRequest, answers: Sequence[Answer]) -> web.Response:
    """The pipeline's JSON for ``answers``, joined from each text's own (no encoding here)."""
    body = response_body(parsed, [a.json for a in answers])
    if len(body) > limit:
        # The parser's bound is an upper bound, so this is a bug; the limit holds regardless.
        log.error("an answer of %d bytes passed the bound of %d bytes; this is a bug", len(body), limit)
        raise ResponseTooLarge(f"the answer takes {len(body)} bytes, more than the limit of {limit}")
    return web.Response(body=body, content_type="application/json", headers=timing_headers(answers))


async def fill_mask(request: web.Request) -> web.Response:
    """``POST /`` (the default model) and ``POST /models/{name}``: raw text or the Inference API's
    JSON in, the pipeline's JSON out. The circuit-breaking stage has admitted it at the door; the
    service admits it again on its cost."""
    service, served = service_of(request.app), served_model(request)
    with state_of(request).trace.step("maskserve.parse"):
        body = await read_body(request)
        parsed = served.parser.parse(body, request_media_type(request))
        plans = await service.plans(parsed, served)
    answers = await text_answers(request, plans, served)
    return json_answer(served.settings.max_response_bytes, parsed, answers)


async def score(request: web.Request) -> web.Response:
    """``POST /score`` and ``POST /models/{name}/score``: each text's pseudo-log-likelihood. Its masked
    copies are fill-mask queries, admitted on their whole cost and batched with every other text."""
    service, served = service_of(request.app), served_model(request)
    with state_of(request).trace.step("maskserve.parse"):
        body = await read_body(request)
        parsed = served.score_parser.parse(body, request_media_type(request))
        per_text = await service.score_copies(parsed, served)
    answers = await answer(request, [copy for copies in per_text for copy in copies], served)
    scores = text_scores(per_text, [a.predictions for a in answers])
    return web.Response(
        body=score_response_body(parsed, scores), content_type="application/json", headers=timing_headers(answers)
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
