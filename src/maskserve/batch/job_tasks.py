"""The server's tasks as a file job runs them: a row's text and parameters in, through the same
parser and task the routes use, and out the same JSON the API answers for that one text.

A row is a request of one text, checked against the same schema and limits as ``POST /`` or
``POST /score`` with that text and those parameters, so a row that the API would refuse gets the
API's error (its ``type`` and ``message``), and any other row the API's answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from maskserve.config.settings import Settings
from maskserve.model_api import FillMaskModel, Query, TextPredictions, text_answer_json
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask import FillMask
from maskserve.tasks.fill_mask_request import RequestParser
from maskserve.tasks.score import Score
from maskserve.tasks.score_request import ScoreRequestParser, score_response_body
from maskserve.tasks.task import Plan

TASKS = ("fill-mask", "score")


class JobTask(Protocol):
    """What a job needs of a task: a row planned into queries, the queries' answers folded back."""

    name: str

    def plan(self, text: str, parameters: dict[str, Any], model: FillMaskModel) -> tuple[Any, Plan]:
        """The row's request and its plan, or the API's 4xx for it."""
        ...

    def result(self, request: Any, plan: Plan, answers: Sequence[Answer], model: FillMaskModel) -> Any:
        """What the API answers for the row's one text, as a JSON value."""
        ...


def document(text: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The API's JSON body for one text and its parameters."""
    return {"inputs": text, "parameters": parameters} if parameters else {"inputs": text}


class FillMaskJob:
    """``POST /``: the pipeline's JSON for the text."""

    name = "fill-mask"

    def __init__(self, settings: Settings) -> None:
        self.parser = RequestParser(settings)
        self.task = FillMask(self.parser)

    def plan(self, text: str, parameters: dict[str, Any], model: FillMaskModel) -> tuple[Any, Plan]:
        request = self.parser.parse_document(document(text, parameters))
        return request, self.task.plan(request, model)

    def result(self, request: Any, plan: Plan, answers: Sequence[Answer], model: FillMaskModel) -> Any:
        (answer,) = self.task.fold(plan, answers, model)  # type: ignore[arg-type]  # its own plan
        return json.loads(answer.json)


class ScoreJob:
    """``POST /score``: the text's pseudo-log-likelihood, as the API answers it."""

    name = "score"

    def __init__(self, settings: Settings) -> None:
        self.parser = ScoreRequestParser(settings)
        self.task = Score(self.parser)

    def plan(self, text: str, parameters: dict[str, Any], model: FillMaskModel) -> tuple[Any, Plan]:
        request = self.parser.parse_document(document(text, parameters))
        return request, self.task.plan(request, model)

    def result(self, request: Any, plan: Plan, answers: Sequence[Answer], model: FillMaskModel) -> Any:
        scores = self.task.fold(plan, answers, model)  # type: ignore[arg-type]  # its own plan
        return json.loads(score_response_body(request, scores, plan.windows))


def job_task(name: str, settings: Settings) -> JobTask:
    """The task ``--task`` names, bound to the model's settings."""
    if name == "score":
        return ScoreJob(settings)
    if name == "fill-mask":
        return FillMaskJob(settings)
    raise ValueError(f"unknown task {name!r}; use one of {', '.join(TASKS)}")


def answer_of(query: Query, predictions: TextPredictions, batch_size: int) -> Answer:
    """A query's answer as the batcher hands it to a task: its predictions, and its JSON unless the
    task reads it itself (a scoring copy)."""
    encoded = b"" if query.read_by_server else text_answer_json(predictions)
    return Answer(predictions=predictions, queued_s=0.0, inference_s=0.0, batch_size=batch_size, json=encoded)
