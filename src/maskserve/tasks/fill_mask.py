"""Fill-mask: each text is one query (every mask, its single-token targets), or its windows when
the model cannot read it whole (windows.py); a whole-word target adds copies of the text
(whole_words.py). The rows' answers fold back into the text's predictions."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from maskserve.model_api import FillMaskModel, Query, text_answer_json
from maskserve.serving.work_queue import Answer, slowest
from maskserve.tasks.fill_mask_request import FillMaskRequest, RequestParser
from maskserve.tasks.whole_words import FillWord, TextPlan, text_predictions
from maskserve.tasks.word_search_plan import WordSearchPlan, search_answers


@dataclass(frozen=True)
class FillMaskPlan:
    """Each text's plan (whole_words.TextPlan), in request order."""

    texts: tuple[TextPlan, ...]

    @property
    def queries(self) -> tuple[Query, ...]:
        return tuple(query for text in self.texts for query in text.queries)

    @property
    def windows(self) -> tuple[int, ...]:
        return tuple(text.windows for text in self.texts)


class FillMask:
    """The fill-mask task of one served model: its answer is one :class:`Answer` per text, holding
    that text's JSON as the pipeline shapes it."""

    def __init__(self, parser: RequestParser) -> None:
        # The served model's limits and checks (fill_mask_request.RequestParser): the same for every surface.
        self.parser = parser

    def tokenizes(self, request: FillMaskRequest) -> int:
        return sum(len(text) for text in (*request.texts, *(request.targets or ())))

    def plan(self, request: FillMaskRequest, model: FillMaskModel) -> FillMaskPlan | WordSearchPlan:
        if request.whole_words:
            return self.parser.search_plan(request, model)
        return FillMaskPlan(tuple(self.parser.plans(request, model)))

    def decodes(self, plan: FillMaskPlan | WordSearchPlan) -> int:
        if isinstance(plan, WordSearchPlan):
            return plan.decoded_predictions
        # Whole words and windows' predictions decoded into the answers, times their texts' tokens;
        # a text read whole without whole words comes back from the inference thread answered and
        # encoded already.
        return sum(text.decoded_predictions * text.query.n_tokens for text in plan.texts)

    def fold(
        self, plan: FillMaskPlan | WordSearchPlan, answers: Sequence[Answer], model: FillMaskModel
    ) -> list[Answer]:
        if isinstance(plan, WordSearchPlan):
            return search_answers(plan, answers, model)
        if not any(text.folds for text in plan.texts):
            return list(answers)  # one query per text, answered as the text
        return combined_answers(plan.texts, answers, model.fill_word)


def combined_answers(plans: Sequence[TextPlan], answers: Sequence[Answer], fill: FillWord) -> list[Answer]:
    """Per text, its queries' answers as one: its predictions with the whole words scored and
    decoded in, its windows' answers put together, as JSON, served as its slowest query was."""
    per_text: list[Answer] = []
    start = 0
    for plan in plans:
        own = answers[start : start + len(plan.queries)]
        start += len(plan.queries)
        if not plan.folds:
            per_text.append(own[0])
            continue
        predictions = text_predictions(plan, [a.predictions for a in own], fill)
        timing = slowest(own)
        per_text.append(
            dataclasses.replace(
                own[0],
                predictions=predictions,
                json=text_answer_json(predictions),
                queued_s=timing.queued_s,
                inference_s=timing.inference_s,
                batch_size=timing.batch_size,
            )
        )
    if start != len(answers):
        raise RuntimeError(f"{len(answers)} answers for {start} queries; this is a bug")
    return per_text
