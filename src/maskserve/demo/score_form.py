"""The demo page's scoring form: sentences in, each one's pseudo-log-likelihood and a bar per token out.

``POST /demo/score`` takes the form (``sentences``, one a line; ``metric``) and answers the whole
page with the scores, or with the error inline and the typed sentences kept. It goes the way of
``POST /score``: the same admission at the door, checks, masked copies, queue and deadline, so
the page and the API make the same decisions. Without JavaScript the form is an ordinary post.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web

from maskserve.demo.page import form_fields, page_model, render
from maskserve.demo.shown import (
    SCORE_FIELDS,
    PageError,
    ScoreForm,
    ScoreResult,
    SentenceScore,
    TokenBar,
    milliseconds,
    page_error,
)
from maskserve.errors import MaskserveError
from maskserve.request.run_task import admit_at_door, note_error, run_task, timing_headers
from maskserve.service.served_model import ServedModel
from maskserve.serving.work_queue import Answer, slowest
from maskserve.tasks.pseudo_likelihood import TextScore
from maskserve.tasks.score_request import DEFAULT_METRIC, ScoreRequest

# The bars are drawn on a log scale: a token the model was sure of (log-probability 0) fills its
# track, and one at this log-probability or below shows as a sliver. Probabilities themselves
# would leave nearly every bar empty, since most tokens of a sentence are far from certain; this
# floor (about one in five hundred million) keeps the unlikely tokens of a sentence apart.
LOG_PROB_FLOOR = -20.0
# How a sentence of several is named in an error, by its line's number among the sentences.
SENTENCE = "sentence {number}"


def nats(log_prob: float) -> str:
    """A log-probability as shown; the most negative float stands for a probability that underflowed."""
    return "-inf" if math.isinf(log_prob) or log_prob <= -1e308 else f"{log_prob:.2f}"


def bar_width(log_prob: float) -> int:
    """1-100 on the log scale of :data:`LOG_PROB_FLOOR`; at least a sliver, since 0 reads as "impossible"."""
    # Clamped first: the most negative float (an underflowed probability) would overflow the arithmetic.
    clamped = min(0.0, max(LOG_PROB_FLOOR, log_prob))
    return max(1, round(100 * (1 - clamped / LOG_PROB_FLOOR)))


def score_result(
    texts: Sequence[str], scores: Sequence[TextScore], answers: Sequence[Answer], windows: Sequence[int]
) -> ScoreResult:
    """What the page shows of the sentences' scores, and of how their copies were served."""
    # The slowest copy's figures, as the timing headers give them.
    timing = slowest(answers)
    return ScoreResult(
        sentences=tuple(
            SentenceScore(
                text=text,
                score=nats(score.score),
                tokens=tuple(
                    TokenBar(token=t["token_str"], log_prob=nats(t["score"]), width=bar_width(t["score"]))
                    for t in score.tokens
                ),
                windows=count,
            )
            for text, score, count in zip(texts, scores, windows, strict=True)
        ),
        queued_ms=milliseconds(timing.queued_s),
        computing_ms=milliseconds(timing.inference_s),
        batch_size=timing.batch_size,
    )


def score_document(sentences: str, metric: str) -> dict[str, Any]:
    """The scoring form as ``POST /score``'s JSON body: one text a non-blank line, each token's bar."""
    texts = [line for line in sentences.splitlines() if line.strip()]
    return {"inputs": texts, "parameters": {"metric": metric, "tokens": True}}


def form_error(error: MaskserveError) -> PageError:
    """The error in plain words, marking the scoring form's field it is about ("" for the whole form)."""
    shown = page_error(error, SCORE_FIELDS)
    if shown.field == "metric":
        return shown
    return PageError(shown.title, shown.message, "sentences" if shown.field else "")


async def demo_score(request: web.Request) -> web.Response:
    """``POST /demo/score``: the scores, through ``POST /score``'s admission, checks, queue and deadline."""
    # Read before admission, as the fill-mask form is: a refusal must still show the typed text.
    sentences, metric, model = await form_fields(request, "sentences", "metric", "model")
    metric = metric or DEFAULT_METRIC
    served: ServedModel | None = None
    try:
        served = chosen = page_model(request, model)
        admit_at_door(request, served)

        async def read() -> ScoreRequest:
            # The form as POST /score's JSON body, checked by the same schema in the same words; a
            # text of several is named by its line ("sentence 2").
            request = chosen.score_parser.parse_document(score_document(sentences, metric))
            return replace(request, element=SENTENCE)

        ran = await run_task(request, served, served.score, read)
    except MaskserveError as exc:
        note_error(request, exc)
        headers = {**exc.headers(), "Cache-Control": "no-store"}
        scoring = ScoreForm(sentences, metric, error=form_error(exc))
        return render(request, text="", top_k="", scoring=scoring, status=exc.status, headers=headers, served=served)
    scoring = ScoreForm(sentences, metric, result=score_result(ran.request.texts, ran.result, ran.rows, ran.windows))
    # The answered page holds the typed sentences: no cache may keep it.
    headers = {**timing_headers(ran.rows), "Cache-Control": "no-store"}
    return render(request, text="", top_k="", scoring=scoring, headers=headers, served=served)
