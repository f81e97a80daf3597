"""Scoring (``/score``): each scored token is one masked copy of its text, or of the window that holds
it (pseudo_likelihood.py), queued like any text; the copies' answers, the true tokens'
probabilities, sum to each text's score."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from maskserve.model_api import FillMaskModel, Query
from maskserve.serving.work_queue import Answer
from maskserve.tasks.pseudo_likelihood import ScoredText, TextScore, text_scores
from maskserve.tasks.score_request import ScoreRequest, ScoreRequestParser


@dataclass(frozen=True)
class ScorePlan:
    """Each text's masked copies, in request order."""

    per_text: tuple[ScoredText, ...]

    @property
    def queries(self) -> tuple[Query, ...]:
        return tuple(copy for text in self.per_text for copy in text.copies)

    @property
    def windows(self) -> tuple[int, ...]:
        return tuple(text.windows for text in self.per_text)


class Score:
    """The scoring task of one served model: its answer is one :class:`TextScore` per text."""

    def __init__(self, parser: ScoreRequestParser) -> None:
        # The served model's limits and checks (score_request.ScoreRequestParser).
        self.parser = parser

    def tokenizes(self, request: ScoreRequest) -> int:
        # A text's copies grow with the square of its length; the characters decide all the same.
        return sum(len(text) for text in request.texts)

    def plan(self, request: ScoreRequest, model: FillMaskModel) -> ScorePlan:
        return ScorePlan(tuple(self.parser.copies(request, model, request.element)))

    def decodes(self, plan: ScorePlan) -> int:
        return 0  # the copies come back with their one prediction decoded; summing is arithmetic

    def fold(self, plan: ScorePlan, answers: Sequence[Answer], model: FillMaskModel) -> list[TextScore]:
        return text_scores([text.copies for text in plan.per_text], [answer.predictions for answer in answers])
