"""The demo page: a server-rendered form that fills in masks through the API's own path.

Routes (see http/routes.py); what the template shows is built in shown.py:
- ``GET /`` renders the page. ``?text=``, ``?top_k=`` and ``?whole_words=on`` only fill in the
  form (the example links), they never run the model: a GET stays cheap, and prefetchers or crawlers queue no work.
- ``POST /demo/score`` takes the scoring form (score_form.py) and answers the same page.
- ``POST /demo`` takes the form (``application/x-www-form-urlencoded``) and answers the page with
  the predictions (each mask's best whole words when its "whole words" box is ticked), or with
  the error inline and the typed text kept. The form cannot post to ``/``: ``POST /`` reads *any*
  non-JSON body as raw text (``curl -d`` sends urlencoded), so a form body there would be filled
  in as ``text=...`` instead of being decoded. A POST rather than
  a GET with the text in the URL, because a 10,000-character text does not fit in a request line.

The page uses the API's parser, deadline, admission and batcher, so overload (503), timeout
(504) and validation errors are the same decisions, rendered in plain words. Everything shown is
escaped by Jinja's autoescape; nothing here marks text safe.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp_jinja2
from aiohttp import web

from maskserve.demo.shown import (
    METRIC_LABELS,
    PageError,
    Result,
    ScoreForm,
    build_result,
    display_name,
    page_error,
)
from maskserve.errors import InvalidBody, MaskserveError
from maskserve.model_api import describe_model
from maskserve.request.keys import service_of
from maskserve.request.run_task import admit_at_door, note_error, read_form, run_task, served_model, timing_headers
from maskserve.service.served_model import ServedModel
from maskserve.tasks.fill_mask_request import FillMaskRequest

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
    whole_words: bool = False,
) -> web.Response:
    """The page for ``served`` (the default model when None); ``scoring`` is the scoring form's
    state (score_form.py), empty when None."""
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
        "whole_words": whole_words,
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


def whole_number(raw: str) -> int | str:
    """A form's number as a JSON body would carry it: an int when it is one, else the text as typed
    (which the schema refuses, as it would in a body)."""
    try:
        return int(raw.strip())
    except ValueError:
        return raw


def fill_mask_document(text: str, top_k: str, whole_words: bool = False) -> dict[str, Any]:
    """The fill-mask form as the API's JSON body: the text, top_k when one is typed, and
    whole_words when its box is ticked (the search's other parameters at their defaults)."""
    parameters: dict[str, Any] = {"top_k": whole_number(top_k)} if top_k.strip() else {}
    if whole_words:
        parameters["whole_words"] = True
    return {"inputs": text, "parameters": parameters}


def ticked(value: str) -> bool:
    """Whether a checkbox's field says ticked: a browser sends its value ("on") only then."""
    return value == "on"


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
    """``GET /``: the page; ``?text=``, ``?top_k=`` and ``?whole_words=on`` fill in the form without
    running it, and ``?model=`` picks the model (the picker's own form sends it)."""
    text, top_k = request.query.get("text", ""), request.query.get("top_k", "")
    whole_words = ticked(request.query.get("whole_words", ""))
    try:
        served = page_model(request, request.query.get("model"))
    except MaskserveError as exc:
        note_error(request, exc)
        return render(
            request, text=text, top_k=top_k, error=page_error(exc), status=exc.status, whole_words=whole_words
        )
    return render(request, text=text, top_k=top_k, served=served, whole_words=whole_words)


async def demo_redirect(request: web.Request) -> web.Response:
    """``GET /demo`` (a reload or a bookmark of the answered page): back to the page itself."""
    raise web.HTTPSeeOther(request.app.router["index"].url_for().with_query(request.query))


async def demo(request: web.Request) -> web.Response:
    """``POST /demo``: the form's answer, through the API's admission, parser, queue and deadline."""
    # The form is read before the deadline and admission, unlike the API: a refusal must still
    # show the typed text in the box, and a form is at most --max-body-bytes.
    text, top_k, model, box = await form_fields(request, "text", "top_k", "model", "whole_words")
    whole_words = ticked(box)
    served: ServedModel | None = None
    try:
        served = chosen = page_model(request, model)
        # The same admission as the API's circuit-breaking stage, then its task, queue and deadline.
        admit_at_door(request, served)

        async def read() -> FillMaskRequest:
            # The form as the API's JSON body, checked by the same schema in the same words.
            return chosen.parser.parse_document(fill_mask_document(text, top_k, whole_words))

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
            whole_words=whole_words,
        )
    result = build_result(text, served.loaded.model.mask_token, ran.result[0], ran.windows[0])
    # The answered page holds the typed text: no cache may keep it.
    headers = {**timing_headers(ran.rows), "Cache-Control": "no-store"}
    return render(
        request, text=text, top_k=top_k, result=result, headers=headers, served=served, whole_words=whole_words
    )
