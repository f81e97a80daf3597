"""What every task's request parser shares: reading a JSON body within its limits, a schema's
complaint in words that name the field, and the length checks. No aiohttp, no torch.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import jsonschema

from maskserve.config.settings import Settings
from maskserve.errors import InvalidBody, InvalidInput, TextTooLong
from maskserve.model_api import FillMaskModel
from maskserve.tasks.windows import LONG_TEXTS, LongText

# The content types read as a JSON body; any other body is the raw text.
JSON_CONTENT_TYPES = frozenset({"application/json"})


def json_depth(document: Any, limit: int) -> int:
    """How deeply containers nest in a parsed JSON value (a scalar is 0, ``[]`` is 1).

    Iterative, so no body can exhaust the stack; stops at the first container deeper than ``limit``.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def load_json(text: str | bytes, max_depth: int) -> Any:
    """A JSON body, parsed; a 400 when it is not JSON or nests deeper than ``max_depth``.

    The depth is checked before any schema validation, whose error messages repr the instance
    recursively: a body nested near Python's recursion limit would otherwise end in a 500.
    """
    try:
        document = json.loads(text)
    except RecursionError:
        raise InvalidBody("the JSON body is nested too deeply") from None
    except ValueError as exc:
        raise InvalidBody(f"the body is not valid JSON ({getattr(exc, 'msg', 'syntax error')})") from None
    if json_depth(document, max_depth) > max_depth:
        raise InvalidBody(f"the JSON body is nested too deeply (more than {max_depth} levels)")
    return document


# JSON schema's type names as a message says them.
TYPE_WORDS = {
    "integer": "a whole number",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


def _as_list(value: Any) -> list[str]:
    return [str(name) for name in value] if isinstance(value, list) else [str(value)]


def schema_error(error: jsonschema.ValidationError) -> InvalidInput:
    """A JSON schema's complaint as a 422 that names the field, for every schema maskserve checks.

    A schema may word its own message for a keyword, in ``"x-messages": {keyword: message}`` next to
    it; otherwise the message is written from the keyword. Nothing of the instance is echoed but
    what is needed, a few names at most: a body of 100,000 unknown keys must not come back whole
    (found by fuzzing).
    """
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    where = path or "body"
    field: str | None = path or None
    validator, value = error.validator, error.validator_value
    if validator == "required" and isinstance(error.instance, dict):
        missing = next((name for name in value if name not in error.instance), value[0])
        field = f"{path}.{missing}" if path else str(missing)
    own = error.schema.get("x-messages", {}).get(validator) if isinstance(error.schema, dict) else None
    if own is not None:
        message = str(own)
    elif validator == "additionalProperties":
        known = error.schema.get("properties", {})
        unknown = [name for name in error.instance if name not in known]
        shown = ", ".join(json.dumps(name[:40]) for name in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        message = f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {shown}{more}"
    elif validator in {"maximum", "minimum"}:
        message = f"{where} must be between {error.schema.get('minimum', 0)} and {error.schema.get('maximum', '...')}"
    elif validator == "maxItems":
        message = f"{where} holds more than {value} items"
    elif validator == "minItems":
        message = f"{where} must not be empty"
    elif validator == "required":
        message = f"{where} needs {', '.join(json.dumps(name) for name in value)}"
    elif validator == "const":
        message = f"{where} must be {json.dumps(value)}"
    elif validator == "type":
        message = f"{where} must be {' or '.join(TYPE_WORDS.get(name, name) for name in _as_list(value))}"
    else:
        message = f"{where}: invalid value"
    return InvalidInput(message, field=field)


def decode_body(body: bytes) -> str:
    """The body as text; a 400 when it is not UTF-8."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(f"the body is not valid UTF-8 (byte {exc.start})") from None


def check_inputs_count(document: Any, limit: int) -> None:
    """Refuse an over-long "inputs" list before schema validation, whose cost grows with every
    item: a body-sized list of numbers held the event loop for seconds (found by fuzzing)."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if isinstance(inputs, list) and len(inputs) > limit:
        raise InvalidInput(f"inputs holds more than {limit} items", field="inputs")


def validate(validator: jsonschema.Draft202012Validator, document: Any) -> None:
    """Raise the 4xx of the most relevant schema error of ``document``, if it has one."""
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        raise schema_error(error)


def check_text_length(text: str, where: str, field: str, max_chars: int) -> None:
    if len(text) > max_chars:
        raise TextTooLong(f"{where} has {len(text)} characters; the limit is {max_chars}", field=field)


def long_text_schema() -> dict[str, Any]:
    """What a text longer than the model reads gets: the one schema every text route uses."""
    return {
        "enum": [*LONG_TEXTS, None],
        "x-messages": {"enum": f"parameters.long_text must be one of {', '.join(LONG_TEXTS)}"},
    }


def check_token_count(
    tokens: int, where: str, field: str, model: FillMaskModel, max_text_tokens: int, long_text: LongText
) -> None:
    """Refuse a text over ``--max-text-tokens``, or longer than the model reads when the request
    asked for the model's reading of the whole text (``long_text: refuse``) rather than windows."""
    if tokens > max_text_tokens:
        raise TextTooLong(
            f"{where} has {tokens} tokens; the limit is {max_text_tokens} (--max-text-tokens)", field=field
        )
    if tokens > model.max_tokens and long_text == "refuse":
        raise TextTooLong(
            f"{where} has {tokens} tokens; this model reads at most {model.max_tokens}, and parameters.long_text "
            '"refuse" asks not to read it in windows',
            field=field,
        )


RequestT = TypeVar("RequestT")


class BodyParser(ABC, Generic[RequestT]):
    """A task's request from a body: a JSON body checked against the task's schema, any other body
    the raw text. Bound to one served model's limits; its schema is compiled once."""

    def __init__(self, settings: Settings, schema: dict[str, Any]) -> None:
        self.settings = settings
        self._validator = jsonschema.Draft202012Validator(schema)

    def parse(self, body: bytes, content_type: str) -> RequestT:
        text = decode_body(body)
        if content_type.lower() in JSON_CONTENT_TYPES:
            return self.parse_document(load_json(text, self.settings.max_json_depth))
        return self.raw_text(text)

    def parse_document(self, document: Any) -> RequestT:
        """A JSON body already read (the API's, or a demo form written as one), checked and built."""
        self.check_before_schema(document)
        validate(self._validator, document)
        return self.built(document)

    def check_before_schema(self, document: Any) -> None:
        """Refusals cheaper than the schema, run first (an over-long list, whose validation costs
        grow with each item)."""
        check_inputs_count(document, self.settings.max_inputs)

    @abstractmethod
    def raw_text(self, text: str) -> RequestT:
        """The request a raw (non-JSON) body makes: its text, the defaults for the rest."""

    @abstractmethod
    def built(self, document: Any) -> RequestT:
        """The request of a JSON body that passed the schema."""
