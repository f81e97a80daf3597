"""What the demo page shows: an answered sentence and its guesses, the scores' bars, errors in plain words.

Plain data for the template (autoescaped: nothing here is markup) and the functions that build it
from the answers. No aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from maskserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    MaskserveError,
    NoMaskToken,
    NotFound,
    ServiceUnavailable,
    ShuttingDown,
    TextTooLong,
)
from maskserve.model_api import Prediction
from maskserve.serving.work_queue import Answer
from maskserve.tasks.pseudo_likelihood import Metric
from maskserve.tasks.score_request import DEFAULT_METRIC


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
    # The windows a text longer than the model reads was read in (1: read whole).
    windows: int = 1


@dataclass(frozen=True)
class PageError:
    """An error in plain words; ``field`` names the input it is about ("" for the whole form)."""

    title: str
    message: str
    field: str = "text"


# -- what the scoring form shows (score_form.py fills it in) ------------------------------------

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
    # 1-100 (score_form.LOG_PROB_FLOOR); one CSS class per step, because the CSP forbids inline styles.
    width: int


@dataclass(frozen=True)
class SentenceScore:
    """A scored sentence as the page shows it."""

    text: str
    score: str
    tokens: tuple[TokenBar, ...]
    # The windows a sentence longer than the model reads was scored in (1: read whole).
    windows: int = 1


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


def build_result(text: str, mask_token: str, answer: Answer, windows: int = 1) -> Result:
    return Result(
        sentence=filled_sentence(text, mask_token, answer.predictions),
        masks=tuple(guesses(predictions) for predictions in answer.predictions),
        queued_ms=milliseconds(answer.queued_s),
        computing_ms=milliseconds(answer.inference_s),
        batch_size=answer.batch_size,
        windows=windows,
    )


# The API's names of the fields a form fills in, and what the form calls each: an error from the
# API's own checks names its field, and the page marks that input and says the form's words.
FILL_MASK_FIELDS: dict[str, tuple[str, str]] = {
    "parameters.top_k": ("top_k", "the number of guesses"),
    "parameters.whole_words": ("whole_words", "whole words"),
    "inputs": ("text", "the text"),
}
SCORE_FIELDS: dict[str, tuple[str, str]] = {
    "parameters.metric": ("metric", "the metric"),
    "inputs": ("sentences", "the list of sentences"),
}


def in_form_words(error: MaskserveError, fields: dict[str, tuple[str, str]]) -> tuple[str, str | None]:
    """The error's message as a sentence, the API's field name put in the form's words, and the
    form's input it is about (None when it names none of them)."""
    message, field = error.message, None
    api_field = getattr(error, "field", None)
    for name, (form_field, words) in fields.items():
        if api_field == name or (api_field or "").startswith(name + "["):
            field = form_field
            if message.startswith(name):
                message = words + message[len(name) :]
            break
    message = message[:1].upper() + message[1:]
    return (message if message.endswith(".") else message + "."), field


def page_error(error: MaskserveError, fields: dict[str, tuple[str, str]] = FILL_MASK_FIELDS) -> PageError:
    """The error in plain words. Only public messages are shown; never a trace or a class name."""
    message, field = in_form_words(error, fields)
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
    if field == "top_k":
        return PageError("Check the number of guesses", message, "top_k")
    if field == "metric":
        return PageError("Check the metric", message, "metric")
    if isinstance(error, InvalidInput):
        return PageError("Check the sentence", message)
    if isinstance(error, NotFound):  # a model name no model is served under (the picker's field)
        return PageError("No such model", message, "")
    if error.status < 500:
        return PageError("The request was not understood", message, "")
    return PageError("Something went wrong", "The server could not answer this sentence. Try again.", "")
