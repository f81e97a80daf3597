"""``POST /score``'s request parsing and validation, and its answer's shape. Knows neither aiohttp nor torch.

Two request forms, as for ``POST /``: a raw text body scores that one text; JSON is
``{"inputs": str | [str], "parameters": {"metric": "original" | "within_word_l2r", "tokens": bool,
"long_text": "window" | "refuse"}}``.
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
from maskserve.model_api import FillMaskModel
from maskserve.tasks.fill_mask_request import inputs_body_schema
from maskserve.tasks.pseudo_likelihood import METRICS, Metric, ScoredText, TextScore, masked_copies
from maskserve.tasks.request_checks import (
    BodyParser,
    check_text_length,
    check_token_count,
    long_text_schema,
)
from maskserve.tasks.windows import DEFAULT_LONG_TEXT, Layout, LongText

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
    # A text longer than the model reads: windows, or a 422.
    long_text: LongText = DEFAULT_LONG_TEXT


def score_request_schema(settings: Settings) -> dict[str, Any]:
    """The JSON schema of a ``/score`` body, with this server's limits."""
    return inputs_body_schema(
        settings,
        {
            "metric": {
                "enum": [*METRICS, None],
                "x-messages": {"enum": f"parameters.metric must be one of {', '.join(METRICS)}"},
            },
            "tokens": {"type": ["boolean", "null"]},
            "long_text": long_text_schema(),
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
        long_text = parameters.get("long_text")
        return ScoreRequest(
            texts=(inputs,) if isinstance(inputs, str) else tuple(inputs),
            batched=not isinstance(inputs, str),
            metric=DEFAULT_METRIC if metric is None else metric,
            tokens=bool(parameters.get("tokens")),
            long_text=DEFAULT_LONG_TEXT if long_text is None else long_text,
        )

    def copies(self, request: ScoreRequest, model: FillMaskModel, element: str = "inputs[{index}]") -> list[ScoredText]:
        """Tokenize and check every text: per text, its masked copies, or the first problem.

        ``element`` names a text of several in the errors (``{index}`` from 0, ``{number}`` from 1):
        the API's JSON path, or the demo page's "sentence 2".
        """
        many = len(request.texts) > 1
        per_text = [
            self._copies(text, element.format(index=index, number=index + 1) if many else None, request, model)
            for index, text in enumerate(request.texts)
        ]
        total = sum(len(text.copies) for text in per_text)
        if total > self.settings.max_queue:
            # Every copy is a queued text: more than the queue holds would be refused 503 forever.
            raise InvalidInput(
                f"this request scores {total} tokens in all; the limit is {self.settings.max_queue} a request "
                "(--max-queue): send fewer or shorter texts",
                field="inputs",
            )
        return per_text

    def _copies(self, text: str, element: str | None, request: ScoreRequest, model: FillMaskModel) -> ScoredText:
        where, field = element or "the text", element or "inputs"
        if not text.strip():
            raise InvalidInput(f"{where} is empty; send a sentence to score", field=field)
        check_text_length(text, where, field, self.settings.max_text_chars)
        words = model.encode_words(text)
        check_token_count(len(words[0]), where, field, model, self.settings.max_text_tokens, request.long_text)
        scored = masked_copies(words, model.mask_token_id, request.metric, Layout.of(model))
        copies = scored.copies
        if len(copies) > self.settings.max_score_tokens:
            raise TextTooLong(
                f"{where} has {len(copies)} tokens to score; the limit is {self.settings.max_score_tokens} "
                "(--max-score-tokens)",
                field=field,
            )
        if not copies:
            raise InvalidInput(f"{where} holds no token to score", field=field)
        return scored


def text_score_json(score: TextScore, with_tokens: bool, windows: int = 1) -> dict[str, Any]:
    """One text's answer: its score, the windows it was read in (1: read whole), and each token's
    score when asked for."""
    answer: dict[str, Any] = {"score": score.score, "windows": windows}
    if with_tokens:
        answer["tokens"] = score.tokens
    return answer


def score_response_body(request: ScoreRequest, scores: Sequence[TextScore], windows: Sequence[int]) -> bytes:
    """One object for one string in, a list in order for a list in."""
    answers = [text_score_json(score, request.tokens, count) for score, count in zip(scores, windows, strict=True)]
    return json.dumps(answers if request.batched else answers[0]).encode()
