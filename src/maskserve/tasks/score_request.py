"""``POST /score``'s request parsing and validation, and its answer's shape. Knows neither aiohttp nor torch.

Two request forms, as for ``POST /``: a raw text body scores that one text; JSON is
``{"inputs": str | [str], "parameters": {"metric": "original" | "within_word_l2r", "tokens": bool}}``.
Everything is checked here, before anything is queued, so a bad input fails alone with a 4xx that
names it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from maskserve.config.settings import Settings
from maskserve.errors import InvalidInput, TextTooLong
from maskserve.model_api import FillMaskModel, Query
from maskserve.tasks.fill_mask_request import inputs_body_schema
from maskserve.tasks.pseudo_likelihood import METRICS, Metric, TextScore, masked_copies
from maskserve.tasks.request_checks import (
    BodyParser,
    check_text_length,
    check_token_count,
)

DEFAULT_METRIC: Metric = "original"


@dataclass(frozen=True)
class ScoreRequest:
    """A parsed ``/score`` request: the texts, whether they came as a list, and the answer parameters."""

    texts: tuple[str, ...]
    batched: bool
    metric: Metric = DEFAULT_METRIC
    tokens: bool = False
    # How errors name a text of several ({index} from 0, {number} from 1): the API's JSON path, or
    # the demo page's "sentence 2".
    element: str = "inputs[{index}]"


def score_request_schema(settings: Settings) -> dict[str, Any]:
    """The JSON schema of a ``/score`` body, with this server's limits."""
    return inputs_body_schema(
        settings,
        {
            "parameters": {
                "type": ["object", "null"],
                "additionalProperties": False,
                "properties": {
                    "metric": {
                        "enum": [*METRICS, None],
                        "x-messages": {"enum": f"parameters.metric must be one of {', '.join(METRICS)}"},
                    },
                    "tokens": {"type": ["boolean", "null"]},
                },
            },
        },
    )


class ScoreRequestParser(BodyParser[ScoreRequest]):
    """Turns a body into a :class:`ScoreRequest`, and its texts into masked copies, or raises a 4xx."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, score_request_schema(settings))

    def raw_text(self, text: str) -> ScoreRequest:
        return ScoreRequest(texts=(text,), batched=False)

    def built(self, document: Any) -> ScoreRequest:
        inputs: str | list[str] = document["inputs"]
        parameters = document.get("parameters") or {}
        metric = parameters.get("metric")
        return ScoreRequest(
            texts=(inputs,) if isinstance(inputs, str) else tuple(inputs),
            batched=not isinstance(inputs, str),
            metric=DEFAULT_METRIC if metric is None else metric,
            tokens=bool(parameters.get("tokens")),
        )

    def copies(
        self, request: ScoreRequest, model: FillMaskModel, element: str = "inputs[{index}]"
    ) -> list[list[Query]]:
        """Tokenize and check every text: per text, its masked copies, or the first problem.

        ``element`` names a text of several in the errors (``{index}`` from 0, ``{number}`` from 1):
        the API's JSON path, or the demo page's "sentence 2".
        """
        many = len(request.texts) > 1
        per_text = [
            self._copies(text, element.format(index=index, number=index + 1) if many else None, request.metric, model)
            for index, text in enumerate(request.texts)
        ]
        total = sum(len(copies) for copies in per_text)
        if total > self.settings.max_queue:
            # Every copy is a queued text: more than the queue holds would be refused 503 forever.
            raise InvalidInput(
                f"this request scores {total} tokens in all; the limit is {self.settings.max_queue} a request "
                "(--max-queue): send fewer or shorter texts",
                field="inputs",
            )
        return per_text

    def _copies(self, text: str, element: str | None, metric: Metric, model: FillMaskModel) -> list[Query]:
        where, field = element or "the text", element or "inputs"
        if not text.strip():
            raise InvalidInput(f"{where} is empty; send a sentence to score", field=field)
        check_text_length(text, where, field, self.settings.max_text_chars)
        words = model.encode_words(text)
        check_token_count(len(words[0]), where, field, model)
        copies = masked_copies(words, model.mask_token_id, metric)
        if len(copies) > self.settings.max_score_tokens:
            raise TextTooLong(
                f"{where} has {len(copies)} tokens to score; the limit is {self.settings.max_score_tokens} "
                "(--max-score-tokens)",
                field=field,
            )
        if not copies:
            raise InvalidInput(f"{where} holds no token to score", field=field)
        return copies


def text_score_json(score: TextScore, with_tokens: bool) -> dict[str, Any]:
    """One text's answer: its score, and each token's when asked for."""
    answer: dict[str, Any] = {"score": score.score}
    if with_tokens:
        answer["tokens"] = score.tokens
    return answer


def score_response_body(request: ScoreRequest, scores: Sequence[TextScore]) -> bytes:
    """One object for one string in, a list in order for a list in."""
    answers = [text_score_json(score, request.tokens) for score in scores]
    return json.dumps(answers if request.batched else answers[0]).encode()
