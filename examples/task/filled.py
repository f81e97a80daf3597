"""An example task: each text with every mask filled by the model's best guess (``POST /filled``).

Not served by default. A task is this module and its route entry: the task (how a request becomes
queued rows, and how their answers fold back), a handler that gives the one path (``run_task``) its
request, and the ``Route`` a caller adds to the server's table:

    create_app(settings, routes=(*ROUTES, FILLED_ROUTE))

Admission, the queue, batching with every other request, deadlines, errors, metrics, tracing and
the OpenAPI document come with the route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from maskserve.api.openapi_components import JSON, ok
from maskserve.api.operations import fixed
from maskserve.http.routes import Route
from maskserve.model_api import FillMaskModel, Query
from maskserve.request.run_task import read_body, request_media_type, run_task, served_model, timing_headers
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask_request import FillMaskRequest, RequestParser


@dataclass(frozen=True)
class FilledPlan:
    """Each text, and its one query: every mask, asked for its best guess."""

    texts: tuple[str, ...]
    queries: tuple[Query, ...]


class Filled:
    """The task: fill-mask's request and checks, one guess a mask, the guesses written into the text."""

    def __init__(self, parser: RequestParser) -> None:
        self.parser = parser

    def tokenizes(self, request: FillMaskRequest) -> int:
        return sum(len(text) for text in request.texts)

    def plan(self, request: FillMaskRequest, model: FillMaskModel) -> FilledPlan:
        best = dataclasses.replace(request, top_k=1, targets=None)
        return FilledPlan(request.texts, tuple(text.query for text in self.parser.plans(best, model)))

    def decodes(self, plan: FilledPlan) -> int:
        return 0  # each guess comes back decoded; writing them in is string work

    def fold(self, plan: FilledPlan, answers: Sequence[Answer], model: FillMaskModel) -> list[str]:
        return [filled_text(text, model.mask_token, answer) for text, answer in zip(plan.texts, answers, strict=True)]


def filled_text(text: str, mask_token: str, answer: Answer) -> str:
    """``text`` with each mask token replaced, in order, by its best guess."""
    parts = text.split(mask_token)
    guesses = [masks[0]["token_str"].strip() for masks in answer.predictions]
    if len(parts) - 1 != len(guesses):  # the tokenizer read the masks otherwise than the text spells them
        return str(answer.predictions[0][0].get("sequence", text))
    return "".join(part + guess for part, guess in zip(parts, [*guesses, ""], strict=True))


async def filled(request: web.Request) -> web.Response:
    """``POST /filled``: raw text or the Inference API's JSON in, ``[{"filled": text}]`` out."""
    served = served_model(request)

    async def read() -> FillMaskRequest:
        return served.parser.parse(await read_body(request), request_media_type(request))

    ran = await run_task(request, served, Filled(served.parser), read)
    return web.json_response([{"filled": text} for text in ran.result], headers=timing_headers(ran.rows))


FILLED_DOC = fixed(
    {
        "summary": "Each text with every mask filled by the model's best guess",
        "description": "The body of POST /; each text comes back with its masks filled in.",
        "parameters": [],
        "responses": {
            "200": ok(
                "Each text, filled in",
                JSON,
                {"type": "array", "items": {"type": "object", "properties": {"filled": {"type": "string"}}}},
            )
        },
    }
)
# Its route entry: an inference route, so the circuit breaker may refuse it at the door.
FILLED_ROUTE = Route("POST", "/filled", "filled", filled, FILLED_DOC, "inference")
