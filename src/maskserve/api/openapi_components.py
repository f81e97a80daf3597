"""The parts of the OpenAPI document that are not operations: its component schemas, and the
small builders of responses and headers that every operation uses (:mod:`maskserve.api.openapi`).

The request schemas are the very ones the parsers validate with, so the document and the server
never disagree on a limit.
"""

from __future__ import annotations

from typing import Any

from maskserve.config.settings import Settings
from maskserve.errors import errors_by_kind
from maskserve.middleware.error_sanitizer import REQUEST_ID_HEADER
from maskserve.tasks.fill_mask_request import request_schema
from maskserve.tasks.oip_tensors import DATATYPE, OUTPUT_NAMES, infer_request_schema
from maskserve.tasks.score_request import score_request_schema

JSON = "application/json"

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def error_kinds() -> list[str]:
    """Every ``kind`` an error body may carry."""
    return sorted(errors_by_kind())


def component_schemas(settings: Settings) -> dict[str, Schema]:
    prediction = {
        "type": "object",
        "required": ["score", "token", "token_str", "sequence"],
        "additionalProperties": False,
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "token": {"type": "integer", "minimum": 0},
            "token_str": {"type": "string"},
            "sequence": {"type": "string"},
            # A whole-word target's candidate only: all its token ids, "token" being the first.
            "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2},
        },
    }
    predictions = {"type": "array", "items": ref("Prediction"), "maxItems": settings.max_top_k}
    per_mask = {"type": "array", "items": ref("Predictions")}
    text_answer = {"anyOf": [ref("Predictions"), per_mask]}
    return {
        "FillMaskRequest": request_schema(settings),
        "Prediction": prediction,
        "Predictions": predictions,
        "FillMaskResponse": {
            "description": (
                "The fill-mask pipeline's shape: a text with one mask answers a list of predictions, "
                "with several masks a list of such lists; a list of inputs answers one of those per input."
            ),
            "anyOf": [
                text_answer,
                {"type": "array", "items": text_answer, "minItems": 1, "maxItems": settings.max_inputs},
            ],
        },
        "ScoreRequest": score_request_schema(settings),
        "TextScore": {
            "description": "A text's pseudo-log-likelihood; `tokens` (when asked for) each scored token's.",
            "type": "object",
            "required": ["score", "windows"],
            "additionalProperties": False,
            "properties": {
                "score": {"type": "number", "maximum": 0},
                "windows": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Windows the text was read in: 1 when the model reads it whole.",
                },
                "tokens": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["token", "token_str", "score"],
                        "additionalProperties": False,
                        "properties": {
                            "token": {"type": "integer", "minimum": 0},
                            "token_str": {"type": "string"},
                            "score": {"type": "number", "maximum": 0},
                        },
                    },
                    "maxItems": settings.max_score_tokens,
                },
            },
        },
        "ScoreResponse": {
            "description": "One text's score for a string in; a list of them, in order, for a list in.",
            "anyOf": [
                ref("TextScore"),
                {"type": "array", "items": ref("TextScore"), "minItems": 1, "maxItems": settings.max_inputs},
            ],
        },
        "Error": {
            "description": (
                "The Hugging Face Inference API's error shape (TGI and TEI use it too), which the "
                "official clients read: `error` is the message for people, `error_type` the stable "
                "kind for programs; the other keys are maskserve's details."
            ),
            "type": "object",
            "required": ["error", "error_type", "request_id"],
            "additionalProperties": False,
            "properties": {
                "error": {"type": "string", "minLength": 1},
                "error_type": {"type": "string", "enum": error_kinds()},
                "request_id": {"type": "string", "minLength": 1},
                "retry_after": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "On 429 and 503: the Retry-After header's seconds.",
                },
                "field": {
                    "type": "string",
                    "description": "On a 4xx about one part of the request: its JSON path, form field or header.",
                },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status", "problems"],
            # The facts a probe looked at (queue depth, busy time...) follow these two fields.
            "additionalProperties": True,
            "properties": {
                "status": {"enum": ["ok", "unavailable"]},
                "problems": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["code", "message"],
                        "additionalProperties": False,
                        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
            },
        },
        "InferRequest": infer_request_schema(settings),
        "InferResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string", "description": "The version, when the path named one."},
                "id": {"type": "string", "description": "The request's id, echoed."},
                "outputs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "datatype", "shape"],
                        "properties": {
                            "name": {"enum": list(OUTPUT_NAMES)},
                            "datatype": {"const": DATATYPE},
                            "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                            "data": {
                                "type": "array",
                                "description": (
                                    "Per text, the JSON that POST / (predictions) or POST /score (scores) answers "
                                    "for that text, as a string."
                                ),
                                "items": {"type": "string"},
                            },
                            "parameters": {"type": "object"},
                        },
                    },
                },
            },
        },
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": ref("TensorMetadata")},
                "outputs": {"type": "array", "items": ref("TensorMetadata")},
                "parameters": {"type": "object"},
            },
        },
        "RepositoryModel": {
            "type": "object",
            "required": ["name", "version", "state"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "state": {"type": "string", "enum": ["READY", "LOADING", "UNLOADING", "UNAVAILABLE"]},
                "reason": {"type": "string"},
                "memory_bytes": {"type": "integer", "description": "Resident memory measured at its last load."},
            },
        },
        "TensorMetadata": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "Info": {
            "type": "object",
            "required": ["model", "batching", "breaker", "connections", "limits", "versions"],
            "properties": {
                name: {"type": ["object", "null"]}
                for name in ("model", "batching", "breaker", "connections", "limits", "versions")
            },
        },
    }


def header(description: str, schema: Schema | None = None, *, required: bool = False) -> Schema:
    return {"description": description, "required": required, "schema": schema or {"type": "string"}}


REQUEST_ID = header("The request's id: the caller's when short and plain, else a new one.", required=True)


def error(description: str, *extra_headers: tuple[str, Schema]) -> Schema:
    return {
        "description": description,
        "headers": {REQUEST_ID_HEADER: REQUEST_ID, **dict(extra_headers)},
        "content": {JSON: {"schema": ref("Error")}},
    }


def retry_after() -> tuple[str, Schema]:
    return (
        "Retry-After",
        header(
            "Whole seconds to wait before retrying, computed from the work ahead.", {"type": "string"}, required=True
        ),
    )


def ok(description: str, content_type: str, schema: Schema, **headers: Schema) -> Schema:
    return {
        "description": description,
        "headers": {REQUEST_ID_HEADER: REQUEST_ID, **headers},
        "content": {content_type: {"schema": schema}},
    }


def windows_header() -> dict[str, Schema]:
    return {
        "X-Text-Windows": header(
            "How many windows each text was read in, in request order, comma-separated: 1 for a text the model "
            "reads whole; a longer one is read in windows of the model's length around its masks (or scored "
            "tokens), those close together sharing one.",
            {"type": "string", "pattern": "^[1-9][0-9]*(, [1-9][0-9]*)*$"},
            required=True,
        )
    }


def timing_headers() -> dict[str, Schema]:
    return {
        "X-Queue-Time-Ms": header("Milliseconds the slowest text waited in the queue."),
        "X-Inference-Time-Ms": header("Milliseconds of the forward pass that answered it."),
        "X-Batch-Size": header("Texts in that forward pass."),
    }
