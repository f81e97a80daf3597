"""The demo page: a server-rendered form that fills in masks through the API's own path.

Routes (see routes.py):
- ``GET /`` renders the page. ``?text=`` and ``?top_k=`` only fill in the form (the example
  links), they never run the model: a GET stays cheap, and prefetchers or crawlers queue no work.
- ``POST /demo/score`` takes the scoring form (score_page.py) and answers the same page.
- ``POST /demo`` takes the form (``application/x-www-form-urlencoded``) and answers the page with
  the predictions, or with the error inline and the typed text kept. The form cannot post to
  ``/``: ``POST /`` reads *any* non-JSON body as raw text (``curl -d`` sends urlencoded), so a
  form body there would be filled in as ``text=...`` instead of being decoded. A POST rather than
  a GET with the text in the URL, because a 10,000-character text does not fit in a request line.

The page uses the API's parser, deadline, admission and batcher, so overload (503), timeout
(504) and validation errors are the same decisions, rendered in plain words. Everything shown is
escaped by Jinja's autoescape; nothing here marks text safe.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from urllib.parse import urlencode

import aiohttp_jinja2
from aiohttp import web

from maskserve.config.settings import Settings
from maskserve.errors import (
    DeadlineExceeded,
    InvalidBody,
    InvalidInput,
    MaskserveError,
    NoMaskToken,
    NotFound,
    ServiceUnavailable,
    ShuttingDown,
    TextTooLong,
)
from maskserve.model_api import Prediction, describe_model
from maskserve.request.keys import service_of
from maskserve.request.run_task import admit_at_door, note_error, read_form, run_task, served_model, timing_headers
from maskserve.service.registry import ServedModel
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask_request import FillMaskRequest
from maskserve.tasks.pseudo_likelihood import Metric
from maskserve.tasks.score_request import DEFAULT_METRIC

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
TEMPLATE = "index.html"

# Sentences one click puts in the box; ``{mask}`` becomes the model's own mask token.
EXAMPLES = (
    "Paris is the {mask} of France.",
    "The {mask} barked at the mailman all morning.",
    "She poured a cup of {mask} and opened the newspaper.",
    "Water boils at one hundred degrees {mask}.",
)

# The page loads only its own CSS and JS (no inline script or style, no third party); it may
# not be framed, and its form posts only here.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
# On every response, API included: they cost nothing and close MIME sniffing and URL leaks.
COMMON_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    # The page's URL may carry the typed text (?text=): never send it to another site.
    "Referrer-Policy": "no-referrer",
}


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: security headers on every response, the CSP on HTML ones."""
    for name, value in COMMON_SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if response.content_type == "text/html":
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)


# -- what the template shows --------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A piece of the filled-in sentence; ``filled`` pieces are predicted words, highlighted."""

    text: str
    filled: bool = False


@dataclass(frozen=True)
class Guess:
    """One row of a mask's table: the word, its probability, and its bar's width class."""

    rank: int
    word: str
    percent: str
    # 0-100, relative to the top guess of the same mask; the CSS has one class per step, because
    # the CSP forbids inline ``style`` attributes.
    width: int


@dataclass(frozen=True)
class Result:
    """Everything the page shows for an answered sentence."""

    sentence: tuple[Segment, ...]
    masks: tuple[tuple[Guess, ...], ...]
    queued_ms: str
    computing_ms: str
    batch_size: int


@dataclass(frozen=True)
class PageError:
    """An error in plain words; ``field`` names the input it is about ("" for the whole form)."""

    title: str
    message: str
    field: str = "text"


# -- what the scoring form shows (score_page.py fills it in) ------------------------------------

# What the form's metric choice says, in the order shown.
METRIC_LABELS: dict[Metric, str] = {
    "original": "original: each token masked alone",
    "within_word_l2r": "within_word_l2r: the rest of its word masked too",
}


@dataclass(frozen=True)
class TokenBar:
    """One token of a scored sentence: its text, its log-probability, and its bar's width class."""

    token: str
    log_prob: str
    # 1-100 (score_page.LOG_PROB_FLOOR); one CSS class per step, because the CSP forbids inline styles.
    width: int


@dataclass(frozen=True)
class SentenceScore:
    """A scored sentence as the page shows it."""

    text: str
    score: str
    tokens: tuple[TokenBar, ...]


@dataclass(frozen=True)
class ScoreResult:
    """Every sentence's score, and how the request was served (the slowest copy's figures)."""

    sentences: tuple[SentenceScore, ...]
    queued_ms: str
    computing_ms: str
    batch_size: int


@dataclass(frozen=True)
class ScoreForm:
    """The scoring form as the page shows it: what was typed, and its answer or its error."""

    sentences: str = ""
    metric: str = DEFAULT_METRIC
    result: ScoreResult | None = None
    error: PageError | None = None


def display_name(name: str) -> str:
    """The model's name without the server's own directory layout.

    A hub id (``google-bert/bert-base-uncased``) is shown as is; a local folder only by its last
    two parts, so the page never reveals where the server keeps its files.
    """
    path = PurePath(name)
    if path.is_absolute() or name.startswith((".", "~")) or len(path.parts) > 2:
        return "/".join(path.parts[-2:])
    return name


def percent(score: float) -> str:
    if 0 < score < 0.0005:
        return "<0.1%"
    return f"{score:.1%}"


def guesses(predictions: list[Prediction]) -> tuple[Guess, ...]:
    """A mask's table rows; bars are scaled to the top guess, so the picture reads at any score."""
    top = max((p["score"] for p in predictions), default=0.0)
    rows = []
    for rank, p in enumerate(predictions, start=1):
        width = round(100 * p["score"] / top) if top > 0 else 0
        # A visible sliver for any non-zero score: a bar of width 0 reads as "impossible".
        rows.append(Guess(rank=rank, word=p["token_str"], percent=percent(p["score"]), width=max(width, 1)))
    return tuple(rows)


def filled_sentence(text: str, mask_token: str, masks: list[list[Prediction]]) -> tuple[Segment, ...]:
    """The user's own text with each mask replaced by its top guess, kept as separate parts.

    Built from the typed text rather than the pipeline's ``sequence`` (which an uncased model
    lowercases), and left in parts so the template escapes each one: the highlight never needs
    markup built from user input.
    """
    parts = text.split(mask_token)
    if len(parts) - 1 != len(masks) or not all(masks):
        # The tokenizer saw a different number of masks than the text spells out: show the
        # pipeline's own sentence for the first mask, unhighlighted, rather than guess.
        return (Segment(masks[0][0]["sequence"]),) if masks and masks[0] else (Segment(text),)
    segments = [Segment(parts[0])]
    for part, predictions in zip(parts[1:], masks):
        segments.append(Segment(predictions[0]["token_str"].strip(), filled=True))
        segments.append(Segment(part))
    return tuple(s for s in segments if s.text)


def milliseconds(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def build_result(text: str, mask_token: str, answer: Answer) -> Result:
    return Result(
        sentence=filled_sentence(text, mask_token, answer.predictions),
        masks=tuple(guesses(predictions) for predictions in answer.predictions),
        queued_ms=milliseconds(answer.queued_s),
        computing_ms=milliseconds(answer.inference_s),
        batch_size=answer.batch_size,
    )


class BadTopK(InvalidInput):
    """The form's number of guesses is not a whole number within the limit.

    Its kind stays ``invalid_input`` for logs and metrics; the class only tells the page which
    field to mark.
    """


def page_error(error: MaskserveError) -> PageError:
    """The error in plain words. Only public messages are shown; never a trace or a class name."""
    message = error.message[:1].upper() + error.message[1:]
    if not message.endswith("."):
        message += "."
    if isinstance(error, ShuttingDown):
        return PageError("The server is restarting", "It accepts no new sentences right now. Try again shortly.", "")
    if isinstance(error, ServiceUnavailable):
        wait = error.headers().get("Retry-After", "a few")
        return PageError(
            "The server is busy", f"Too many sentences are waiting. Try again in about {wait} seconds.", ""
        )
    if isinstance(error, DeadlineExceeded):
        return PageError("That took too long", "The answer was not ready in time. Try again in a moment.", "")
    if isinstance(error, NoMaskToken):
        return PageError("Nothing to fill in", message)
    if isinstance(error, TextTooLong):
        return PageError("The text is too long", message)
    if isinstance(error, BadTopK):
        return PageError("Check the number of guesses", message, "top_k")
    if isinstance(error, InvalidInput):
        return PageError("Check the sentence", message)
    if isinstance(error, NotFound):  # a model name no model is served under (the picker's field)
        return PageError("No such model", message, "")
    if error.status < 500:
        return PageError("The request was not understood", message, "")
    return PageError("Something went wrong", "The server could not answer this sentence. Try again.", "")


def parse_top_k(raw: str, settings: Settings) -> int:
    if not raw.strip():
        return settings.default_top_k
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= settings.max_top_k:
        raise BadTopK(f"the number of guesses must be a whole number from 1 to {settings.max_top_k}", field="top_k")
    return value


def render(
    request: web.Request,
    *,
    text: str,
    top_k: str,
    result: Result | None = None,
    error: PageError | None = None,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    scoring: ScoreForm | None = None,
    served: ServedModel | None = None,
) -> web.Response:
    """The page for ``served`` (the default model when None); ``scoring`` is the scoring form's
    state (score_page.py), empty when None."""
    service = service_of(request.app)
    served = served or service.default
    model, settings = served.loaded.model, served.settings
    # With several models, the page's links and forms carry the chosen one (the picker sets it).
    several = len(service.models) > 1
    chosen = {"model": served.name} if several else {}
    examples = [example.format(mask=model.mask_token) for example in EXAMPLES]
    description = describe_model(model)
    context = {
        # The model picker: every served model's name, when there are several.
        "models": list(service.models) if several else [],
        "chosen_model": served.name,
        "model_name": display_name(model.name),
        "model_architecture": str(description.get("architecture", "")),
        # "cpu · float32": where and how the guesses are computed, when the model says so.
        "model_runs_on": " · ".join(str(description[k]) for k in ("device", "dtype") if k in description),
        "mask_token": model.mask_token,
        "max_text_chars": settings.max_text_chars,
        "max_top_k": settings.max_top_k,
        "text": text,
        "top_k": top_k or str(settings.default_top_k),
        "examples": [(example, "/?" + urlencode({**chosen, "text": example})) for example in examples],
        "result": result,
        "error": error,
        "scoring": scoring or ScoreForm(),
        "metrics": METRIC_LABELS,
        "max_inputs": settings.max_inputs,
        "max_score_tokens": settings.max_score_tokens,
        # A scoring request's copies in all: POST /score refuses more than the queue holds.
        "max_queue": settings.max_queue,
        # For the curl line in the footer: this server as the browser reached it (escaped).
        "origin": str(request.url.origin()),
    }
    response = aiohttp_jinja2.render_template(TEMPLATE, request, context, status=status)
    response.headers.update(headers or {})
    return response


# -- handlers -----------------------------------------------------------------------------------


async def form_fields(request: web.Request, *names: str) -> tuple[str, ...]:
    """A page form's fields by name, each a string ("" when absent or not text), read within
    ``--body-timeout``; a form that cannot be read is a 400."""
    try:
        form = await read_form(request)
    except ValueError:  # UnicodeDecodeError included: a form that is not UTF-8, a broken multipart
        raise InvalidBody("the form cannot be read: send it as UTF-8 application/x-www-form-urlencoded") from None
    return tuple(value if isinstance(value := form.get(name, ""), str) else "" for name in names)


def page_model(request: web.Request, name: object) -> ServedModel:
    """The model a page's query or form names (a ``model`` field; the default when absent or empty);
    a 404 naming the served ones otherwise."""
    return served_model(request, name if isinstance(name, str) and name else None)


async def index(request: web.Request) -> web.Response:
    """``GET /``: the page; ``?text=`` and ``?top_k=`` fill in the form without running it, and
    ``?model=`` picks the model (the picker's own form sends it)."""
    text, top_k = request.query.get("text", ""), request.query.get("top_k", "")
    try:
        served = page_model(request, request.query.get("model"))
    except MaskserveError as exc:
        note_error(request, exc)
        return render(request, text=text, top_k=top_k, error=page_error(exc), status=exc.status)
    return render(request, text=text, top_k=top_k, served=served)


async def demo_redirect(request: web.Request) -> web.Response:
    """``GET /demo`` (a reload or a bookmark of the answered page): back to the page itself."""
    raise web.HTTPSeeOther(request.app.router["index"].url_for().with_query(request.query))


async def demo(request: web.Request) -> web.Response:
    """``POST /demo``: the form's answer, through the API's admission, parser, queue and deadline."""
    # The form is read before the deadline and admission, unlike the API: a refusal must still
    # show the typed text in the box, and a form is at most --max-body-bytes.
    text, top_k, model = await form_fields(request, "text", "top_k", "model")
    served: ServedModel | None = None
    try:
        served = chosen = page_model(request, model)
        # The same admission as the API's circuit-breaking stage, then its task, queue and deadline.
        admit_at_door(request, served)

        async def read() -> FillMaskRequest:
            top_k_value = parse_top_k(top_k, chosen.settings)
            return FillMaskRequest(texts=(text,), batched=False, top_k=top_k_value, targets=None)

        ran = await run_task(request, served, served.fill_mask, read)
    except MaskserveError as exc:
        # The error stage's bookkeeping, but the page shows the error in plain words.
        note_error(request, exc)
        headers = {**exc.headers(), "Cache-Control": "no-store"}
        return render(
            request,
            text=text,
            top_k=top_k,
            error=page_error(exc),
            status=exc.status,
            headers=headers,
            served=served,
        )
    result = build_result(text, served.loaded.model.mask_token, ran.result[0])
    # The answered page holds the typed text: no cache may keep it.
    headers = {**timing_headers(ran.rows), "Cache-Control": "no-store"}
    return render(request, text=text, top_k=top_k, result=result, headers=headers, served=served)
