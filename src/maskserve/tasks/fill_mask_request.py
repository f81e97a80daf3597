"""Request parsing and validation, and the response shape. Knows neither aiohttp nor torch.

Two request forms reach ``POST /``:
- raw text: any body that is not JSON is the sentence itself (``curl -d`` sends it as
  ``application/x-www-form-urlencoded``, but it is never form-decoded);
- the Hugging Face Inference API's JSON: ``{"inputs": str | [str], "parameters": {"top_k": int,
  "targets": str | [str], "multi_token_targets": "whole_word" | "first_token", "long_text":
  "window" | "refuse"}}``; a target of several tokens is a whole word (whole_words.py) unless
  ``first_token`` asks for the pipeline's first token; a text longer than the model reads is read
  in windows (windows.py) unless ``refuse`` asks for a 422; ``"whole_words": true`` (with
  ``max_word_pieces`` and ``word_beam``) answers each mask's best whole words (word_search.py).
Everything is checked here, before anything is queued, so a bad input fails alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from maskserve.config.settings import Settings
from maskserve.errors import (
    InvalidInput,
    NoMaskToken,
    ResponseTooLarge,
    TextTooLong,
    TooManyMasks,
    TooManyPredictions,
)
from maskserve.model_api import FillMaskModel, Query
from maskserve.tasks.request_checks import (
    BodyParser,
    check_inputs_count,
    check_text_length,
    check_token_count,
    long_text_schema,
)
from maskserve.tasks.whole_words import (
    DEFAULT_MULTI_TOKEN_TARGETS,
    MULTI_TOKEN_TARGETS,
    MultiTokenTargets,
    Targets,
    TextPlan,
    plan_text,
    split_targets,
)
from maskserve.tasks.windows import DEFAULT_LONG_TEXT, Layout, LongText, fits
from maskserve.tasks.word_search import (
    DEFAULT_MAX_WORD_PIECES,
    DEFAULT_WORD_BEAM,
    MAX_WORD_BEAM,
    MAX_WORD_PIECES,
)
from maskserve.tasks.word_search_plan import SearchSize, WordSearchPlan, plan_search

# A whole word's "tokens" list in JSON: the key and brackets, then per id its digits and ", ",
# each within this many bytes (ids run to a few hundred thousand).
WORD_IDS_JSON_BYTES = 16


@dataclass(frozen=True)
class FillMaskRequest:
    """A parsed request: the texts, whether they came as a list, and the answer parameters."""

    texts: tuple[str, ...]
    batched: bool
    top_k: int
    targets: tuple[str, ...] | None
    # Where the texts sit in the request, for errors about one of them ("inputs[2]").
    location: str = "inputs"
    # A target of several tokens: the whole word (scored by the chain rule), or its first token.
    multi_token_targets: MultiTokenTargets = DEFAULT_MULTI_TOKEN_TARGETS
    # A text longer than the model reads: windows, or a 422.
    long_text: LongText = DEFAULT_LONG_TEXT
    # Each mask's best whole words, of up to max_word_pieces pieces, found with a beam this wide.
    whole_words: bool = False
    max_word_pieces: int = DEFAULT_MAX_WORD_PIECES
    word_beam: int = DEFAULT_WORD_BEAM


def inputs_body_schema(
    settings: Settings, parameters: dict[str, Any], others: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON body of ``"inputs"`` (one text or a list of them, within this server's limit), an
    optional ``"parameters"`` object holding only ``parameters``, and ``others`` beside them: the
    shape every text route takes."""
    text = {"type": "string"}
    return {
        "type": "object",
        "required": ["inputs"],
        "additionalProperties": False,
        "x-messages": {"required": 'the JSON body needs "inputs": a string or a list of strings'},
        "properties": {
            "inputs": {
                "oneOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": settings.max_inputs}],
                "x-messages": {"oneOf": "inputs must be a string or a non-empty list of strings"},
            },
            "parameters": {"type": ["object", "null"], "additionalProperties": False, "properties": parameters},
            **(others or {}),
        },
    }


def request_schema(settings: Settings) -> dict[str, Any]:
    """The JSON schema of the Inference API body, with this server's limits."""
    text = {"type": "string"}
    return inputs_body_schema(
        settings,
        {
            "top_k": {"type": ["integer", "null"], "minimum": 1, "maximum": settings.max_top_k},
            "targets": {
                "oneOf": [
                    {"type": "null"},
                    text,
                    {"type": "array", "items": text, "minItems": 1, "maxItems": settings.max_targets},
                ],
                "x-messages": {"oneOf": "parameters.targets must be a string or a non-empty list of strings"},
            },
            "multi_token_targets": multi_token_targets_schema(),
            "long_text": long_text_schema(),
            **whole_words_schema(),
        },
        # Older Inference API clients send {"options": {"wait_for_model": true}}; nothing to do.
        {"options": {"type": ["object", "null"]}},
    )


def whole_words_schema() -> dict[str, Any]:
    """The whole-word search's parameters, with their limits."""
    return {
        "whole_words": {
            "type": ["boolean", "null"],
            "description": "Answer each mask's top_k whole words, of one or several pieces, ranked by the chain "
            "rule's probability (as whole-word targets are scored); not with targets. Default false.",
        },
        "max_word_pieces": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_WORD_PIECES,
            "description": f"With whole_words: how many pieces a word may take. Default {DEFAULT_MAX_WORD_PIECES}.",
        },
        "word_beam": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_WORD_BEAM,
            "description": f"With whole_words: prefixes the search keeps per word length. Default {DEFAULT_WORD_BEAM}.",
        },
    }


def whole_words_fields(parameters: dict[str, Any]) -> dict[str, Any]:
    """The whole-word search's fields of a :class:`FillMaskRequest`, from a request's parameters
    (checked by :func:`whole_words_schema`): the one reading every surface shares."""
    whole_words = bool(parameters.get("whole_words"))
    if whole_words and parameters.get("targets") is not None:
        raise InvalidInput(
            "parameters.whole_words finds the words itself: send it without parameters.targets (which scores "
            "the words named)",
            field="parameters.whole_words",
        )
    pieces, beam = parameters.get("max_word_pieces"), parameters.get("word_beam")
    return {
        "whole_words": whole_words,
        "max_word_pieces": DEFAULT_MAX_WORD_PIECES if pieces is None else int(pieces),
        "word_beam": DEFAULT_WORD_BEAM if beam is None else int(beam),
    }


def multi_token_targets_schema() -> dict[str, Any]:
    """How a target of several tokens is answered: the one schema every route that takes targets uses."""
    return {
        "enum": [*MULTI_TOKEN_TARGETS, None],
        "x-messages": {"enum": f"parameters.multi_token_targets must be one of {', '.join(MULTI_TOKEN_TARGETS)}"},
    }


class RequestParser(BodyParser[FillMaskRequest]):
    """Turns a body and its content type into a :class:`FillMaskRequest`, or raises a 4xx."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, request_schema(settings))

    def raw_text(self, text: str) -> FillMaskRequest:
        return FillMaskRequest(texts=(text,), batched=False, top_k=self.settings.default_top_k, targets=None)

    def built(self, document: Any) -> FillMaskRequest:
        inputs = document["inputs"]
        parameters = document.get("parameters") or {}
        targets = parameters.get("targets")
        top_k = parameters.get("top_k")
        mode = parameters.get("multi_token_targets")
        long_text = parameters.get("long_text")
        return FillMaskRequest(
            texts=(inputs,) if isinstance(inputs, str) else tuple(inputs),
            batched=not isinstance(inputs, str),
            top_k=self.settings.default_top_k if top_k is None else int(top_k),
            targets=None if targets is None else ((targets,) if isinstance(targets, str) else tuple(targets)),
            multi_token_targets=DEFAULT_MULTI_TOKEN_TARGETS if mode is None else mode,
            long_text=DEFAULT_LONG_TEXT if long_text is None else long_text,
            **whole_words_fields(parameters),
        )

    def check_before_schema(self, document: Any) -> None:
        """Refuse over-long lists, inputs and targets, before schema validation (see :func:`check_inputs_count`)."""
        check_inputs_count(document, self.settings.max_inputs)
        if not isinstance(document, dict):
            return
        parameters = document.get("parameters")
        targets = parameters.get("targets") if isinstance(parameters, dict) else None
        if isinstance(targets, list) and len(targets) > self.settings.max_targets:
            raise InvalidInput(
                f"parameters.targets holds more than {self.settings.max_targets} items", field="parameters.targets"
            )

    def plans(self, request: FillMaskRequest, model: FillMaskModel) -> list[TextPlan]:
        """Tokenize and check every text; one :class:`TextPlan` per text (its query or its windows,
        and the copies its whole-word targets take), or the first problem."""
        targets = self._targets(request, model)
        many = len(request.texts) > 1
        layout = Layout.of(model)
        # A whole word of k tokens grows its text's copies by k - 1.
        grows = max((len(word) - 1 for word in targets.words), default=0) if targets is not None else 0
        plans: list[TextPlan] = []
        for index, text in enumerate(request.texts):
            element = f"{request.location}[{index}]" if many else None
            query = self._query(text, element, request, None if targets is None else targets.single, model)
            if targets is not None:
                self._check_word_lengths(query, targets, element or "the text", layout, request.long_text)
            # Only a text read in windows needs its words (a window never cuts one): a second pass
            # of the tokenizer, over long texts alone.
            word_ids = None if fits(query.n_tokens + grows, layout) else model.encode_words(text)[1]
            plans.append(plan_text(query, targets, model.mask_token_id, layout, word_ids))
        self._check_copies(plans)
        self._check_queued(plans)
        self._check_answer_size(plans, model)
        return plans

    def search_plan(self, request: FillMaskRequest, model: FillMaskModel) -> WordSearchPlan:
        """Each text's searches, one per mask (word_search_plan.plan_search), or the first problem."""
        many = len(request.texts) > 1
        places = [f"{request.location}[{index}]" if many else None for index in range(len(request.texts))]
        queries = [self._query(text, place, request, None, model) for text, place in zip(request.texts, places)]
        fields = [place or request.location for place in places]
        size = SearchSize(request.max_word_pieces, request.word_beam, self.settings.max_queue)
        return plan_search(
            queries, fields, model, size, request.long_text, lambda index: model.encode_words(request.texts[index])[1]
        )

    def _targets(self, request: FillMaskRequest, model: FillMaskModel) -> Targets | None:
        if request.targets is None:
            return None
        if any(not t.strip() for t in request.targets):
            raise InvalidInput("parameters.targets must not contain empty strings", field="parameters.targets")
        targets = split_targets(request.targets, model.target_tokens(request.targets), request.multi_token_targets)
        if not targets.single and not targets.words:
            raise InvalidInput("none of parameters.targets is in the model's vocabulary", field="parameters.targets")
        return targets

    def _check_word_lengths(
        self, query: Query, targets: Targets, where: str, layout: Layout, long_text: LongText
    ) -> None:
        """A whole word of k tokens grows its text's copies by k - 1: the copies are read in windows
        that much narrower, which must still hold half of what the model reads; asked not to
        window, the copies must fit the model whole."""
        longest = layout.inner // 2 + 1
        for name, word in zip(targets.names, targets.words):
            tokens = query.n_tokens + len(word) - 1
            if len(word) > longest:
                raise TextTooLong(
                    f"the target {name[:40]!r} takes {len(word)} tokens; a whole word may take at most {longest} "
                    f"(half of the {layout.length} tokens this model reads, so that its copies keep some text)",
                    field="parameters.targets",
                )
            if long_text == "refuse" and not fits(tokens, layout):
                raise TextTooLong(
                    f"the target {name[:40]!r} takes {len(word)} tokens: in place of a mask, {where} would have "
                    f"{tokens} tokens; this model reads at most {layout.length}, and parameters.long_text "
                    '"refuse" asks not to read it in windows',
                    field="parameters.targets",
                )

    def _check_copies(self, plans: Sequence[TextPlan]) -> None:
        """Refuse whole-word targets that take more copies than a request may queue."""
        copies = sum(len(plan.copies) for plan in plans)
        if not copies:
            return
        settings = self.settings
        hint = "send fewer texts, masks or multi-token targets, or ask for parameters.multi_token_targets first_token"
        if copies > settings.max_word_copies:
            raise InvalidInput(
                f"this request's whole-word targets take {copies} copies of its texts (one per mask and target "
                f"token); the limit is {settings.max_word_copies} (--max-word-copies): {hint}",
                field="parameters.targets",
            )

    def _check_queued(self, plans: Sequence[TextPlan]) -> None:
        """Refuse a request whose rows (texts, windows, whole-word copies) are more than the queue holds:
        every row is a queued text, so it would be refused 503 forever."""
        queued = sum(len(plan.queries) for plan in plans)
        if queued <= self.settings.max_queue:
            return
        copies = sum(len(plan.copies) for plan in plans)
        windows = sum(len(plan.reads) for plan in plans)
        parts = [f"{copies} whole-word copies"] if copies else []
        parts += [f"{windows} windows of long texts"] if windows else []
        raise InvalidInput(
            f"this request queues {queued} texts ({', '.join(parts)}); the queue holds {self.settings.max_queue} "
            "(--max-queue): send fewer or shorter texts, masks or multi-token targets",
            field="parameters.targets" if copies else "inputs",
        )

    def _check_answer_size(self, plans: Sequence[TextPlan], model: FillMaskModel) -> None:
        """Refuse, before any work, an answer too costly to make or too big to send.

        Every prediction decodes its whole text again (its ``sequence``), so the work after the
        forward pass and the answer's size both grow with texts x masks x top_k x length. A
        whole-word copy is one more prediction, and so is each whole word decoded into the answer.
        """
        settings = self.settings
        queries = [plan.query for plan in plans]
        asked = sum(q.predictions for plan in plans for q in plan.queries)
        words = sum(plan.word_predictions for plan in plans)
        predictions = asked + words
        if predictions > settings.max_predictions:
            masks = sum(q.n_masks for q in queries)
            extra = predictions - sum(q.predictions for q in queries)
            whole = f", {extra} of them for whole-word targets" if words else ""
            raise TooManyPredictions(
                f"this request asks for {predictions} predictions ({len(queries)} texts with {masks} masks, "
                f"top_k {queries[0].top_k}{whole}); the limit is {settings.max_predictions}: ask for a smaller "
                "top_k, or send fewer texts, masks or targets"
            )
        # The list brackets and separators, then each text's predictions at their largest.
        size = 2 + sum(2 + self._answer_bytes(plan, model) for plan in plans)
        if size > settings.max_response_bytes:
            answered = sum(plan.answer_predictions for plan in plans)
            raise ResponseTooLarge(
                f"the answer could take up to {size} bytes (each of its {answered} predictions repeats its "
                f"whole text), more than the limit of {settings.max_response_bytes}: ask for a smaller top_k, or "
                "send fewer or shorter texts"
            )

    @staticmethod
    def _answer_bytes(plan: TextPlan, model: FillMaskModel) -> int:
        """At most how many bytes a text's answer takes: its predictions, each at its largest."""
        ids = plan.query.input_ids
        largest = model.prediction_bytes(ids)
        for word in plan.words:
            # The word is in the sequence and in token_str, and its ids are listed ("tokens").
            largest = max(largest, model.prediction_bytes((*ids, *word, *word)) + WORD_IDS_JSON_BYTES * (len(word) + 1))
        return plan.answer_predictions * largest

    def _query(
        self,
        text: str,
        element: str | None,
        request: FillMaskRequest,
        target_ids: tuple[int, ...] | None,
        model: FillMaskModel,
    ) -> Query:
        where = element or "the text"
        # A raw-text body is the Inference API's "inputs" itself.
        field = element or request.location
        top_k = request.top_k
        if not text.strip():
            raise InvalidInput(f"{where} is empty; send a sentence with {model.mask_token} in it", field=field)
        check_text_length(text, where, field, self.settings.max_text_chars)
        if model.mask_token not in text:
            raise NoMaskToken(
                f"{where} holds no mask token; put {model.mask_token} where a word should be filled in", field=field
            )
        input_ids = model.encode(text)
        check_token_count(len(input_ids), where, field, model, self.settings.max_text_tokens, request.long_text)
        masks = model.count_masks(input_ids)
        if masks == 0:
            raise NoMaskToken(f"{where} holds no usable mask token; write {model.mask_token} exactly", field=field)
        allowed = self.settings.masks_allowed(len(input_ids), model.max_tokens)
        if masks > allowed:
            per = (
                "a text"
                if allowed == self.settings.max_masks_per_text
                else f"for a text of {len(input_ids)} tokens ({self.settings.max_masks_per_text} for every "
                f"{model.max_tokens} tokens this model reads)"
            )
            raise TooManyMasks(
                f"{where} holds {masks} mask tokens; the limit is {allowed} {per} (--max-masks-per-text)",
                field=field,
            )
        return Query(input_ids=input_ids, top_k=top_k, target_ids=target_ids, n_masks=masks)


def response_body(request: FillMaskRequest, texts_json: Sequence[bytes]) -> bytes:
    """The pipeline's output shape as JSON, from each text's own (:func:`model_api.text_answer_json`,
    made on the inference thread): a single (non-list) input unwrapped, a list kept. The event loop
    only joins them, whatever their size."""
    return b"[" + b", ".join(texts_json) + b"]" if request.batched else texts_json[0]
