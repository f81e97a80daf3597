"""How the limits fit each other: a default that follows the limit a user sets, and the pairs of
values that contradict (start-up refuses those, naming both)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from maskserve.config.settings import Settings, flag_name, setting_fields


@dataclass(frozen=True)
class Bound:
    """Two limits of which ``lower`` may not exceed ``upper``, and why.

    A user who sets one of them alone gets the other's default moved to fit (see
    :func:`settings_from`): one setting changed is one setting written. Only values the user wrote
    can contradict each other, and start-up refuses that (exit 2), naming both.
    """

    lower: str
    upper: str
    why: str


BOUNDS: tuple[Bound, ...] = (
    Bound(
        "max_inputs",
        "max_queue",
        "a request of more texts than the queue holds would be admitted by the limits and then refused 503 "
        "forever, since the queue can never hold it",
    ),
    Bound(
        "max_score_tokens",
        "max_queue",
        "each scored token is one queued copy of its text, so a text at the limit could never be queued",
    ),
    Bound(
        "max_word_copies",
        "max_queue",
        "each whole-word copy is one queued text, so a request at the limit could never be queued",
    ),
    Bound("default_top_k", "max_top_k", "a request that names no top_k would ask for more than any request may"),
    Bound("default_top_k", "max_predictions", "a request of one text and one mask would already ask for too many"),
    Bound(
        "max_response_bytes",
        "max_unsent_bytes",
        "an answer of the largest size would not fit under the bound even alone, so every reader of one "
        "would be cut to make room for the next",
    ),
)
# A limit is the lower of some bounds or the upper of others, never both: so following needs one
# pass that raises uppers and one that lowers lowers, in that order, and never a fixed point.
assert not {b.lower for b in BOUNDS} & {b.upper for b in BOUNDS}, "a limit both lower and upper: this is a bug"


def settings_from(given: Mapping[str, Any]) -> Settings:
    """The settings the user ``given`` (values by name, already parsed), the rest at their defaults,
    each default bounded by a user's value moved to fit it (:data:`BOUNDS`).

    An upper limit the user left alone rises to the largest lower one they set (``--max-inputs 300``
    raises the queue to 300); then a lower limit left alone takes the largest value its uppers allow
    (``--max-queue 8`` brings ``--max-inputs``, ``--max-score-tokens`` and ``--max-word-copies`` to 8).
    ``max_batch_delay`` and ``request_timeout`` never move: the timeout is the wait promised to every
    client, not a capacity, and the delay's default (0) fits every timeout.
    """
    values: dict[str, Any] = {f.name: f.default for f in setting_fields()} | dict(given)
    for bound in BOUNDS:
        if bound.lower in given and bound.upper not in given:
            values[bound.upper] = max(values[bound.upper], values[bound.lower])
    for bound in BOUNDS:
        if bound.lower not in given:
            values[bound.lower] = min(values[bound.lower], values[bound.upper])
    return Settings(**values, given=frozenset(given))


def followed(settings: Settings) -> dict[str, str]:
    """The limits whose default moved to fit a value the user set: each name, and the setting it follows."""
    defaults = {f.name: f.default for f in setting_fields()}
    moved: dict[str, str] = {}
    for bound in BOUNDS:
        for name, other in ((bound.lower, bound.upper), (bound.upper, bound.lower)):
            value = getattr(settings, name)
            if name not in settings.given and value != defaults[name] and value == getattr(settings, other):
                moved.setdefault(name, other)
    return moved


def contradictions(settings: Settings) -> Iterator[tuple[str, str, str]]:
    """``(setting, other setting, why)`` for each pair of values that cannot both hold.

    Each would start a server that misbehaves only later, under load or for one kind of request:
    start-up refuses it instead (exit 2), naming both settings. Built by :func:`settings_from`, only
    values the user wrote can contradict. Pairs that involve the middleware chain are checked by the
    layer that builds it (see ``checks`` in :func:`load_settings`).
    """
    for bound in BOUNDS:
        if getattr(settings, bound.lower) > getattr(settings, bound.upper):
            yield bound.lower, bound.upper, bound.why
    if settings.max_batch_delay >= settings.request_timeout:
        yield "max_batch_delay", "request_timeout", "a request could time out waiting for others to batch with"


def follows_note(name: str) -> str:
    """How a limit's default moves to fit the ones the user sets (:data:`BOUNDS`), for ``--help``
    and the docs; "" for a setting whose default never moves."""
    lowers = [flag_name(b.lower) for b in BOUNDS if b.upper == name]
    uppers = [flag_name(b.upper) for b in BOUNDS if b.lower == name]
    if lowers:
        return f"or the largest of {', '.join(lowers)} you set, if larger"
    if uppers:
        return f"or the smallest of {', '.join(uppers)} you set, if smaller"
    return ""
