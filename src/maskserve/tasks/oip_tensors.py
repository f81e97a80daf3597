"""The Open Inference Protocol's ("KServe v2") infer request and response for fill-mask. No aiohttp.

The model takes one BYTES input, ``text``, of shape ``[-1]``: one or more UTF-8 texts. It has two
BYTES outputs of the same shape, and a request asks for one (``predictions`` when it names none):

- ``predictions``: fill-mask. Per text, the JSON that ``POST /`` answers for that text alone (as
  MLServer's Hugging Face runtime does). ``top_k`` and ``targets`` are request ``parameters``; the
  protocol's parameter values are scalars, so ``targets`` is a string, comma-separated for several
  words (a JSON list is accepted too). ``multi_token_targets``, and ``whole_words`` with
  ``max_word_pieces`` and ``word_beam`` (each mask's best whole words), are as for ``POST /``.
- ``scores``: the pseudo-log-likelihood. Per text, the JSON ``POST /score`` answers for that text
  (``score``, ``windows``, and ``tokens`` when the ``tokens`` parameter is true); ``metric`` is as
  for ``POST /score``.

``long_text`` (windows, or a 422, for a text longer than the model reads) applies to both. A
parameter of the other output is refused, naming it. The REST route and the gRPC service
(``rpc/``) read the same document: JSON over REST, the protobuf message turned into it over gRPC.

Tensor data comes as JSON (the protocol's required form) or in Triton's binary tensor data
extension, which ``tritonclient`` uses by default: the body is the JSON header
(``Inference-Header-Content-Length`` bytes) followed by the raw tensors, a BYTES element being a
4-byte little-endian length and its bytes. Outputs are answered in the form asked for.
Everything is checked here, before anything is queued, naming the field at fault.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from maskserve.config.settings import Settings
from maskserve.errors import InvalidBody, InvalidInput
from maskserve.tasks.fill_mask_request import (
    FillMaskRequest,
    multi_token_targets_schema,
    whole_words_fields,
    whole_words_schema,
)
from maskserve.tasks.pseudo_likelihood import METRICS
from maskserve.tasks.request_checks import load_json, long_text_schema, schema_error
from maskserve.tasks.score_request import DEFAULT_METRIC, ScoreRequest

INPUT_NAME = "text"
# The fill-mask output, and the one answered when a request names none.
OUTPUT_NAME = "predictions"
# The scoring output: each text's pseudo-log-likelihood, as POST /score answers it.
SCORES_NAME = "scores"
OUTPUT_NAMES = (OUTPUT_NAME, SCORES_NAME)
_OUTPUTS_SAID = " or ".join(f'"{name}"' for name in OUTPUT_NAMES)
# Each output's own parameters: one output's are refused on a request for the other.
TASK_PARAMETERS = {
    OUTPUT_NAME: ("top_k", "targets", "multi_token_targets", "whole_words", "max_word_pieces", "word_beam"),
    SCORES_NAME: ("metric", "tokens"),
}
DATATYPE = "BYTES"
# Triton's binary tensor data extension: the JSON header's length, in a request and in a response.
HEADER_LENGTH = "Inference-Header-Content-Length"
_LENGTH = struct.Struct("<I")


def infer_request_schema(settings: Settings) -> dict[str, Any]:
    """The JSON schema of an infer request's JSON (header), with this server's limits."""
    parameters = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "array"]}}
    return {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {
                **parameters,
                "properties": {
                    "top_k": {"type": "integer", "minimum": 1, "maximum": settings.max_top_k},
                    "targets": {
                        "oneOf": [
                            {"type": "string", "minLength": 1},
                            {"type": "array", "items": {"type": "string"}, "minItems": 1},
                        ],
                        "x-messages": {
                            "oneOf": "parameters.targets must be a word, several comma-separated, or a list of words"
                        },
                    },
                    "multi_token_targets": multi_token_targets_schema(),
                    **whole_words_schema(),
                    "metric": {
                        "enum": list(METRICS),
                        "x-messages": {"enum": f"parameters.metric must be one of {', '.join(METRICS)}"},
                    },
                    "tokens": {"type": "boolean"},
                    "long_text": long_text_schema(),
                    "binary_data_output": {"type": "boolean"},
                },
            },
            "inputs": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "x-messages": {
                    "minItems": f'inputs must hold exactly one input, "{INPUT_NAME}"',
                    "maxItems": f'inputs must hold exactly one input, "{INPUT_NAME}"',
                },
                "items": {
                    "type": "object",
                    "required": ["name", "shape", "datatype"],
                    "properties": {
                        "name": {"const": INPUT_NAME},
                        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 8},
                        "datatype": {"const": DATATYPE},
                        "parameters": {
                            **parameters,
                            "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
                        },
                        "data": {"type": "array"},
                    },
                },
            },
            "outputs": {
                "type": "array",
                "maxItems": 1,
                "x-messages": {"maxItems": f"outputs may name one output: {_OUTPUTS_SAID}"},
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {
                            "enum": list(OUTPUT_NAMES),
                            "x-messages": {"enum": f"outputs[0].name must be {_OUTPUTS_SAID}"},
                        },
                        "parameters": {**parameters, "properties": {"binary_data": {"type": "boolean"}}},
                    },
                },
            },
        },
    }


@dataclass(frozen=True)
class InferRequest:
    """A parsed infer request: what to fill or score, its id to echo, which output it asked for and
    whether to answer in binary."""

    request: FillMaskRequest | ScoreRequest
    id: str | None
    binary_output: bool
    output: str = OUTPUT_NAME


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major elements of a (possibly nested) JSON tensor; its depth is bounded by the parser."""
    flat: list[Any] = []
    for item in data:
        if isinstance(item, list):
            flat.extend(_flatten(item))
        else:
            flat.append(item)
    return flat


def decode_bytes_tensor(blob: bytes, count: int) -> list[bytes]:
    """``count`` BYTES elements of Triton's binary form: each a 4-byte little-endian length, then it."""
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + _LENGTH.size > len(blob):
            raise InvalidInput("the binary text tensor holds fewer elements than its shape says", field="inputs[0]")
        (length,) = _LENGTH.unpack_from(blob, offset)
        offset += _LENGTH.size
        if offset + length > len(blob):
            raise InvalidInput("an element of the binary text tensor runs past its end", field="inputs[0]")
        items.append(blob[offset : offset + length])
        offset += length
    if offset != len(blob):
        raise InvalidInput("the binary text tensor holds more data than its shape says", field="inputs[0]")
    return items


def encode_bytes_tensor(items: Sequence[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(item)) + item for item in items)


class InferRequestParser:
    """Turns an infer request body into an :class:`InferRequest`, or raises a 4xx naming the problem."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._validator = jsonschema.Draft202012Validator(infer_request_schema(settings))

    def parse(self, body: bytes, header_length: str | None) -> InferRequest:
        """A REST body: JSON, or Triton's binary form (its JSON header's length given)."""
        header, binary = self._split(body, header_length)
        return self.parse_document(load_json(header, self.settings.max_json_depth), binary)

    def parse_document(self, document: object, binary: bytes = b"", *, schema_holds: bool = False) -> InferRequest:
        """An infer request as the JSON document the protocol defines, and the binary tensor data
        its input names (``binary_data_size``): what REST bodies and gRPC messages both become.

        ``schema_holds``: the caller has checked, on its typed form, that the document is certainly
        one the schema admits (gRPC's common messages), so the schema's walk is skipped; any
        document it is not sure of takes that walk, which names what is wrong."""
        if not schema_holds:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(document))
            if error is not None:
                raise schema_error(error)
        assert isinstance(document, dict)  # the schema says so
        tensor = document["inputs"][0]
        texts = tuple(self._texts(tensor, binary))
        parameters = document.get("parameters") or {}
        outputs = document.get("outputs")
        binary_output = (
            bool(outputs[0].get("parameters", {}).get("binary_data", False))
            if outputs
            else bool(parameters.get("binary_data_output", False))
        )
        output = outputs[0]["name"] if outputs else OUTPUT_NAME
        for other, names in TASK_PARAMETERS.items():
            wrong = next((name for name in names if other != output and name in parameters), None)
            if wrong is not None:
                raise InvalidInput(
                    f"parameters.{wrong} is a parameter of the {other!r} output; this request asks for {output!r}",
                    field=f"parameters.{wrong}",
                )
        long_text = parameters.get("long_text")
        more: dict[str, Any] = {} if long_text is None else {"long_text": long_text}
        request: FillMaskRequest | ScoreRequest
        if output == SCORES_NAME:
            request = ScoreRequest(
                texts=texts,
                batched=True,
                metric=parameters.get("metric", DEFAULT_METRIC),
                tokens=bool(parameters.get("tokens", False)),
                element="inputs[0].data[{index}]",
                **more,
            )
        else:
            top_k = parameters.get("top_k")
            mode = parameters.get("multi_token_targets")
            request = FillMaskRequest(
                texts=texts,
                batched=True,
                location="inputs[0].data",
                top_k=self.settings.default_top_k if top_k is None else int(top_k),
                targets=self._targets(parameters.get("targets")),
                **({} if mode is None else {"multi_token_targets": mode}),
                **whole_words_fields(parameters),
                **more,
            )
        return InferRequest(request=request, id=document.get("id"), binary_output=binary_output, output=output)

    def _split(self, body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
        if header_length is None:
            return body, b""
        try:
            length = int(header_length)
        except ValueError:
            length = -1
        if not 0 < length <= len(body):
            raise InvalidBody(
                f"{HEADER_LENGTH} must be the length of the JSON header, at most the body's {len(body)} bytes"
            )
        return body[:length], body[length:]

    def _texts(self, tensor: dict[str, Any], binary: bytes) -> list[str]:
        shape: list[int] = tensor["shape"]
        count = math.prod(shape)
        if not 1 <= count <= self.settings.max_inputs:
            raise InvalidInput(
                f"inputs[0].shape holds {count} texts; send 1 to {self.settings.max_inputs}", field="inputs[0].shape"
            )
        binary_size = (tensor.get("parameters") or {}).get("binary_data_size")
        if binary_size is not None:
            if "data" in tensor or binary_size != len(binary):
                raise InvalidInput(
                    "inputs[0] must carry its texts either in data or in binary_data_size bytes after the "
                    "JSON header, which must be all the body holds after it",
                    field="inputs[0]",
                )
            raw = decode_bytes_tensor(binary, count)
        else:
            if binary:
                raise InvalidInput("binary data follows the JSON header, but no input names its size", field="inputs")
            if "data" not in tensor:
                raise InvalidInput("inputs[0] needs data: the texts, a list of strings", field="inputs[0].data")
            flat = _flatten(tensor["data"])
            if len(flat) != count or not all(isinstance(item, str) for item in flat):
                raise InvalidInput(
                    f"inputs[0].data must hold {count} strings, as its shape {shape} says", field="inputs[0].data"
                )
            return flat
        try:
            return [item.decode("utf-8") for item in raw]
        except UnicodeDecodeError:
            raise InvalidInput("a text of the binary tensor is not valid UTF-8", field="inputs[0]") from None

    def _targets(self, targets: str | list[str] | None) -> tuple[str, ...] | None:
        if targets is None:
            return None
        words = targets.split(",") if isinstance(targets, str) else targets
        if len(words) > self.settings.max_targets:
            raise InvalidInput(
                f"parameters.targets holds more than {self.settings.max_targets} words", field="parameters.targets"
            )
        return tuple(word.strip() for word in words)


def infer_response(
    model_name: str, request: InferRequest, texts_json: Sequence[bytes], *, version: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """The infer response's body and headers, in JSON or in the binary extension as asked.

    Each text's output element is the JSON ``POST /`` (or ``POST /score``) answers for that text
    alone. ``model_version`` is there when the request named
    a version, and the request's ``id`` is echoed.
    """
    items = list(texts_json)
    output: dict[str, Any] = {"name": request.output, "datatype": DATATYPE, "shape": [len(items)]}
    response: dict[str, Any] = {"model_name": model_name, "outputs": [output]}
    if version is not None:
        response["model_version"] = version
    if request.id is not None:
        response["id"] = request.id
    if not request.binary_output:
        output["data"] = [item.decode() for item in items]
        return json.dumps(response).encode(), {"Content-Type": "application/json"}
    blob = encode_bytes_tensor(items)
    output["parameters"] = {"binary_data_size": len(blob)}
    header = json.dumps(response).encode()
    return header + blob, {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
