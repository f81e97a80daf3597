"""How the limits fit each other: defaults that follow another limit, a default that moves to fit
the limit a user sets, and the pairs of values that contradict (start-up refuses those, naming
both)."""

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


@dataclass(frozen=True)
class Follow:
    """A limit whose default is ``times`` another limit's value, and why: a user who sets ``source``
    moves ``name`` with it, unless they set ``name`` too."""

    name: str
    source: str
    times: int
    why: str

    def rule(self, source: str) -> str:
        """The rule, naming the source as ``source`` (its setting's name, or its flag)."""
        return source if self.times == 1 else f"{self.times} x {source}"


FOLLOWS: tuple[Follow, ...] = (
    Follow(
        "max_text_chars",
        "max_text_tokens",
        8,
        "eight characters a token (English prose takes four or five), so that the token limit is what a long "
        "text meets",
    ),
    Follow(
        "max_score_tokens",
        "max_text_tokens",
        1,
        "a text longer than the model is scored window by window, each copy at most the model's length, so its "
        "cost grows with its length alone: a text that may be read may be scored, within the request timeout",
    ),
)
# A followed limit follows a limit that follows nothing: one pass sets them all.
assert not {f.source for f in FOLLOWS} & {f.name for f in FOLLOWS}, "a chain of follows: this is a bug"

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
    """The settings the user ``given`` (values by name, already parsed), the rest at their defaults:
    each followed default at its multiple of its source (:data:`FOLLOWS`), then each default bounded
    by a user's value moved to fit it (:data:`BOUNDS`).

    ``--max-text-tokens 8192`` brings ``--max-score-tokens`` to 8192 and ``--max-text-chars`` to
    65536. An upper limit the user left alone rises to the largest lower one they set, or that
    follows one they set (``--max-inputs 5000`` raises the queue to 5000); then a lower limit left
    alone takes the largest value its uppers allow (``--max-queue 8`` brings ``--max-inputs``,
    ``--max-score-tokens`` and ``--max-word-copies`` to 8). ``max_batch_delay`` and
    ``request_timeout`` never move: the timeout is the wait promised to every client, not a
    capacity, and the delay's default (0) fits every timeout.
    """
    values: dict[str, Any] = {f.name: f.default for f in setting_fields()} | dict(given)
    written = set(given)
    for follow in FOLLOWS:
        if follow.name not in given:
            values[follow.name] = follow.times * values[follow.source]
            if follow.source in given:
                written.add(follow.name)
    for bound in BOUNDS:
        if bound.lower in written and bound.upper not in given:
            values[bound.upper] = max(values[bound.upper], values[bound.lower])
    for bound in BOUNDS:
        if bound.lower not in given:
            values[bound.lower] = min(values[bound.lower], values[bound.upper])
    return Settings(**values, given=frozenset(given))


def followed(settings: Settings) -> dict[str, str]:
    """The limits whose default moved to fit a value the user set: each name, and the setting it follows."""
    defaults = {f.name: f.default for f in setting_fields()}
    moved: dict[str, str] = {}
    for follow in FOLLOWS:
        value = getattr(settings, follow.name)
        moved_here = follow.name not in settings.given and value != defaults[follow.name]
        if moved_here and value == follow.times * getattr(settings, follow.source):
            moved[follow.name] = follow.source
    for bound in BOUNDS:
        for name, other in ((bound.lower, bound.upper), (bound.upper, bound.lower)):
            value = getattr(settings, name)
            if name not in settings.given and value != defaults[name] and value == getattr(settings, other):
                moved.setdefault(name, other)
    return moved


# A default that scales with the text rather than with another setting (Settings.masks_allowed).
PER_MODEL_LENGTH = ("max_masks_per_text",)


def following(settings: Settings) -> dict[str, str]:
    """How each default the user left alone follows another limit, stated once for ``/info``:
    ``{"max_score_tokens": "max_text_tokens", "max_text_chars": "8 x max_text_tokens",
    "max_masks_per_text": "each model length of a text"}``."""
    rules = {f.name: f.rule(f.source) for f in FOLLOWS}
    rules |= {name: "each model length of a text" for name in PER_MODEL_LENGTH}
    return {name: rule for name, rule in rules.items() if name not in settings.given}


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
    # Explicit control loads models only through the load route, which needs the control key:
    # without one, no model beyond the preloaded ones could ever be served.
    if settings.model_control_mode == "explicit" and settings.control_key is None:
        yield "model_control_mode", "control_key", "explicit control needs a key for its load and unload routes"
    # Each listener needs a port of its own: the second to bind would stop start-up anyway, after
    # the models had loaded, and say less.
    ports = [(name, getattr(settings, name)) for name in ("port", "grpc_port", "agent_port")]
    for index, (first, port) in enumerate(ports):
        for second, other in ports[index + 1 :]:
            if port and port == other:
                yield first, second, "two listeners cannot share a port"


def follows_note(name: str) -> str:
    """How a limit's default follows another (:data:`FOLLOWS`) and moves to fit the ones the user
    sets (:data:`BOUNDS`), for ``--help`` and the docs; "" for a setting whose default never moves."""
    notes = [f"following {f.rule(flag_name(f.source))}" for f in FOLLOWS if f.name == name]
    if name in PER_MODEL_LENGTH:
        notes.append("for each model length of a text unless set")
    lowers = [flag_name(b.lower) for b in BOUNDS if b.upper == name]
    uppers = [flag_name(b.upper) for b in BOUNDS if b.lower == name]
    if lowers:
        notes.append(f"or the largest of {', '.join(lowers)} you set, if larger")
    if uppers:
        notes.append(f"or the smallest of {', '.join(uppers)} you set, if smaller")
    return ", ".join(notes)
