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
from maskserve.request.run_task import (
    read_body,
    request_media_type,
    run_task,
    served_model,
    timing_headers,
    windows_header,
)
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask import FillMask, FillMaskPlan
from maskserve.tasks.fill_mask_request import FillMaskRequest, RequestParser


@dataclass(frozen=True)
class FilledPlan:
    """Each text, and fill-mask's own plan of it: every mask asked for its best guess, the text
    read whole or, when longer than the model reads, in windows."""

    texts: tuple[str, ...]
    fill_mask: FillMaskPlan

    @property
    def queries(self) -> tuple[Query, ...]:
        return self.fill_mask.queries

    @property
    def windows(self) -> tuple[int, ...]:
        return self.fill_mask.windows


class Filled:
    """The task: fill-mask's request, checks and rows, one guess a mask, the guesses written into the text."""

    def __init__(self, parser: RequestParser) -> None:
        self.fill_mask = FillMask(parser)

    def tokenizes(self, request: FillMaskRequest) -> int:
        return self.fill_mask.tokenizes(request)

    def plan(self, request: FillMaskRequest, model: FillMaskModel) -> FilledPlan:
        best = dataclasses.replace(request, top_k=1, targets=None)
        return FilledPlan(request.texts, self.fill_mask.plan(best, model))

    def decodes(self, plan: FilledPlan) -> int:
        # A long text's windows fold into its answer (fill-mask's work); writing the guesses in is string work.
        return self.fill_mask.decodes(plan.fill_mask)

    def fold(self, plan: FilledPlan, answers: Sequence[Answer], model: FillMaskModel) -> list[str]:
        per_text = self.fill_mask.fold(plan.fill_mask, answers, model)
        return [filled_text(text, model.mask_token, answer) for text, answer in zip(plan.texts, per_text, strict=True)]


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
    headers = timing_headers(ran.rows) | windows_header(ran.windows)
    return web.json_response([{"filled": text} for text in ran.result], headers=headers)


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
