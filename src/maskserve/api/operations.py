"""Each operation of the OpenAPI document that serves a model (fill-mask, score, the protocol's infer,
the demo forms), written once from this server's limits, and the helpers that bind an operation
to a route: :func:`fixed`, :func:`for_model`, :func:`versioned`. The route table names them.
"""

from __future__ import annotations

from maskserve.api.openapi_components import (
    JSON,
    Schema,
    error,
    header,
    ok,
    ref,
    retry_after,
    timing_headers,
    windows_header,
)
from maskserve.config.settings import Settings
from maskserve.middleware.error_sanitizer import REQUEST_ID_HEADER
from maskserve.request.deadlines import TIMEOUT_HEADER
from maskserve.service.registry import Describe
from maskserve.tasks.oip_tensors import DATATYPE, HEADER_LENGTH, INPUT_NAME, OUTPUT_NAME, SCORES_NAME
from maskserve.tasks.pseudo_likelihood import METRICS
from maskserve.tasks.score_request import DEFAULT_METRIC

HTML = "text/html"
# The Prometheus text exposition format, as prometheus_client names it.
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def _body_refusals(settings: Settings, what: str) -> dict[str, Schema]:
    """A body-reading operation's refusals: too slow, too large (``what``: "The body", "The form")."""
    return {
        "408": error(
            f"{what} did not arrive within {settings.body_timeout:g} s of the headers "
            "(--body-timeout); the connection closes after this answer."
        ),
        "413": error(f"{what} is larger than {settings.max_body_bytes} bytes (--max-body-bytes)."),
    }


def _model_work_refusals() -> dict[str, Schema]:
    """What an operation that queues work for the model may answer besides its own: a failed pass,
    a refusal at the door, a missed deadline."""
    return {
        "500": error("The model failed on this input (its batch neighbours were answered)."),
        "503": error(
            "Overloaded or shutting down: refused before the body is read; or the model left under the "
            "request (model_unavailable: unloaded, and no reload's model in its place).",
            retry_after(),
        ),
        "504": error("The deadline passed before the answer was ready."),
    }


def probe_operation(summary: str, description: str) -> Schema:
    return {
        "summary": summary,
        "description": description,
        "tags": ["operations"],
        "responses": {
            "200": ok("Healthy.", JSON, ref("Health")),
            "503": ok("Not healthy; `problems` says why.", JSON, ref("Health")),
        },
    }


def fill_mask_doc(settings: Settings, mask_token: str) -> Schema:
    example = f"Paris is the {mask_token} of France."
    raw_text = {"schema": {"type": "string", "minLength": 1, "maxLength": settings.max_text_chars}, "example": example}
    return {
        "summary": "Fill in the mask tokens of one text or of a list of texts",
        "description": (
            "Two forms. The Hugging Face Inference API's JSON (`Content-Type: application/json`), or "
            "the raw text itself with any other content type (never form-decoded: `curl -d` works). "
            f"Limits: a body of at most {settings.max_body_bytes} bytes, at most {settings.max_inputs} "
            f"inputs of at most {settings.max_text_chars} characters and {settings.max_text_tokens} tokens each, "
            f"top_k from 1 to {settings.max_top_k}, at most {settings.max_targets} targets, JSON nested at "
            f"most {settings.max_json_depth} levels. A target of several tokens is scored as the whole word "
            "(the product of each token's probability with the ones before it filled in and the rest masked), "
            "and its candidate lists all its token ids in `tokens`; `parameters.multi_token_targets: "
            '"first_token"` answers its first token instead, as the fill-mask pipeline does. Its copies of '
            f"the text count against at most {settings.max_word_copies} a request. A text longer than the "
            "model reads is read in windows of the model's length around its masks (`X-Text-Windows` says how "
            'many); `parameters.long_text: "refuse"` answers 422 instead.'
        ),
        "tags": ["inference"],
        "parameters": [
            {
                "name": TIMEOUT_HEADER,
                "in": "header",
                "required": False,
                "description": (
                    f"Seconds this request may take; shortens (never lengthens) the server's "
                    f"{settings.request_timeout:g} s. Not a positive number: 400."
                ),
                "schema": {"type": "number", "exclusiveMinimum": 0},
            },
            {
                "name": REQUEST_ID_HEADER,
                "in": "header",
                "required": False,
                # Any value is accepted (never a 400): one that is not short and plain is replaced.
                "description": (
                    "An id to find this request in the server's log: kept when it matches "
                    "`^[A-Za-z0-9._:-]{1,64}$`, else replaced by a fresh one."
                ),
                "schema": {"type": "string"},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                JSON: {
                    "schema": ref("FillMaskRequest"),
                    "example": {"inputs": example, "parameters": {"top_k": 3}},
                },
                "text/plain": raw_text,
                "application/x-www-form-urlencoded": raw_text,
            },
        },
        "responses": {
            "200": ok("The predictions.", JSON, ref("FillMaskResponse"), **timing_headers(), **windows_header()),
            "400": error("The body is not UTF-8 or not JSON, or a header is unusable."),
            **_body_refusals(settings, "The body"),
            "422": error("Well-formed but unusable: no mask token, too long, a value out of range, unknown field."),
            **_model_work_refusals(),
        },
    }


def score_doc(settings: Settings, mask_token: str) -> Schema:
    example = "Paris is the capital of France."
    raw_text = {"schema": {"type": "string", "minLength": 1, "maxLength": settings.max_text_chars}, "example": example}
    fill_mask = fill_mask_doc(settings, "[MASK]")
    return {
        "summary": "Score texts by their pseudo-log-likelihood under the model",
        "description": (
            "Each token but the special ones is masked in turn (`original`), or with the rest of its "
            "word to its right (`within_word_l2r`); a token's score is the natural log-probability of "
            "the true token there, and a text's score their sum. JSON (`Content-Type: application/json`) "
            "or the raw text itself with any other content type. One string in, one object out; a list "
            f"in, a list out, in order. Limits: at most {settings.max_inputs} inputs of at most "
            f"{settings.max_text_chars} characters, {settings.max_text_tokens} tokens and "
            f"{settings.max_score_tokens} scored tokens each, at most {settings.max_queue} scored tokens a "
            "request. Each scored token is one text's work, admitted, timed out and batched like any other. "
            "A text longer than the model reads is scored in windows of the model's length, each token read "
            'in the window around it (`windows` says how many); `parameters.long_text: "refuse"` answers '
            "422 instead."
        ),
        "tags": ["inference"],
        "parameters": fill_mask["parameters"],
        "requestBody": {
            "required": True,
            "content": {
                JSON: {
                    "schema": ref("ScoreRequest"),
                    "example": {"inputs": [example], "parameters": {"metric": "within_word_l2r", "tokens": True}},
                },
                "text/plain": raw_text,
                "application/x-www-form-urlencoded": raw_text,
            },
        },
        "responses": {
            "200": ok("Each text's score.", JSON, ref("ScoreResponse"), **timing_headers(), **windows_header()),
            "400": error("The body is not UTF-8 or not JSON, or a header is unusable."),
            **_body_refusals(settings, "The body"),
            "422": error("Well-formed but unusable: an empty text, too many tokens, an unknown metric or field."),
            **_model_work_refusals(),
        },
    }


MODEL_PARAMETER = {
    "name": "model",
    "in": "path",
    "required": True,
    "description": "A served model's name (--model NAME=..., or --model-name for a lone model); any other is a 404.",
    "schema": {"type": "string"},
}
VERSION_PARAMETER: Schema = {
    "name": "version",
    "in": "path",
    "required": True,
    "description": "The model's version: 1, the one served (model metadata lists it); any other is a 404.",
    "schema": {"type": "string"},
}


def oip_probe_operation(summary: str, *, per_model: bool = False) -> Schema:
    probe: Schema = {
        "summary": summary,
        "description": "The protocol's health check: 200, or 400 (its 4xx) with the problems, as /readyz says them.",
        "tags": ["open inference protocol"],
        "responses": {
            "200": ok("Healthy.", JSON, ref("Health")),
            "400": ok("Not healthy; `problems` says why.", JSON, ref("Health")),
        },
    }
    if per_model:
        # Triton's answer: a model not serving is a "no", never an error its clients would raise.
        probe["description"] = (
            "The protocol's model readiness: 200 while the server is ready and the model serves; 400 (its 4xx) "
            "otherwise, with the problems: an unknown name or version, a model not loaded, or one still loading."
        )
        probe["parameters"] = [MODEL_PARAMETER]
    return probe


def oip_infer_doc(settings: Settings, mask_token: str) -> Schema:
    example = f"Paris is the {mask_token} of France."
    return {
        "summary": "Open Inference Protocol inference: texts in, each text's predictions (or scores) out",
        "description": (
            f'One BYTES input "{INPUT_NAME}" of shape [n], 1 <= n <= {settings.max_inputs}; the BYTES output the '
            f'request names (outputs[0].name), of the same shape: "{OUTPUT_NAME}" (the default), each element '
            f'the JSON `POST /` answers for that text, or "{SCORES_NAME}", the JSON `POST /score` answers for it. '
            "`top_k`, `targets` (comma-separated, or a list), `multi_token_targets`, and `whole_words` with "
            "`max_word_pieces` and `word_beam`, are request parameters "
            f'of "{OUTPUT_NAME}", as for `POST /`; `metric` and `tokens` of "{SCORES_NAME}", as for `POST /score`; '
            "`long_text` of both. Tensors in JSON, or "
            f"in Triton's binary tensor data extension ({HEADER_LENGTH}; the answer follows the request's "
            "binary_data / binary_data_output). Same limits, admission, deadline and errors as `POST /`."
        ),
        "tags": ["open inference protocol"],
        "parameters": [MODEL_PARAMETER],
        "requestBody": {
            "required": True,
            "content": {
                JSON: {
                    "schema": ref("InferRequest"),
                    "example": {
                        "inputs": [{"name": INPUT_NAME, "shape": [1], "datatype": DATATYPE, "data": [example]}],
                        "parameters": {"top_k": 3},
                    },
                }
            },
        },
        "responses": {
            "200": ok(
                "Each text's predictions or scores.", JSON, ref("InferResponse"), **timing_headers(), **windows_header()
            )
            | {
                "content": {
                    JSON: {"schema": ref("InferResponse")},
                    # Triton's binary form: the JSON header, then the tensor (see the description).
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                }
            },
            "400": error("The body is not JSON, or the binary tensor framing is wrong."),
            "404": error("No model of that name is served."),
            **_body_refusals(settings, "The body"),
            "422": error("Well-formed but unusable: the tensor's name, type or shape, no mask token, a value."),
            **_model_work_refusals(),
        },
    }


def _versioned(operation: Schema) -> Schema:
    """The same operation on the path that also names the model's version."""
    versioned = {**operation, "parameters": [*operation.get("parameters", []), VERSION_PARAMETER]}
    versioned["responses"] = dict(operation["responses"])
    if "404" in versioned["responses"]:
        versioned["responses"]["404"] = error("No model of that name, or no such version of it, is served.")
    return versioned


def demo_doc(settings: Settings, mask_token: str) -> Schema:
    form = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": settings.max_text_chars},
            "top_k": {"type": "string", "description": f"A whole number from 1 to {settings.max_top_k}."},
        },
    }
    page = {"type": "string"}
    return {
        "summary": "The demo page's form: the answer (or the error in plain words) as the page",
        "tags": ["demo"],
        "requestBody": {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": form}}},
        "responses": {
            status: ok(description, HTML, page)
            for status, description in (
                ("200", "The page with the predictions."),
                ("422", "The page with the problem shown next to the field."),
                ("500", "The page saying the model failed on this text."),
                ("503", "The page saying the server is busy or restarting."),
                ("504", "The page saying the answer was not ready in time."),
            )
        }
        # Raised while reading the form, before the page can render: the API's error shape.
        | {
            "400": error("The form cannot be read (not UTF-8, a broken multipart body)."),
            **_body_refusals(settings, "The form"),
        },
    }


NAME_PARAMETER: Schema = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "A served model's name (GET /info lists them, each with its own limits); any other is a 404.",
    "schema": {"type": "string"},
}


def _for_model(operation: Schema, what: str) -> Schema:
    """``operation`` (which serves the default model) for the model its path names."""
    return {
        **operation,
        "summary": f"{operation['summary']}, with the model named in the path",
        "description": f"As {what}, for any served model; the limits are that model's own. {operation['description']}",
        "parameters": [NAME_PARAMETER, *operation["parameters"]],
        "responses": {
            **operation["responses"],
            "404": error("No model of that name is served; the message names the served ones."),
        },
    }


def demo_score_doc(settings: Settings, mask_token: str) -> Schema:
    form = {
        "type": "object",
        "properties": {
            "sentences": {
                "type": "string",
                "description": f"One sentence a line (blank lines skipped), at most {settings.max_inputs}.",
            },
            # As the page's select sends it; left empty, the default (as POST /score's is).
            "metric": {"enum": [*METRICS, ""], "default": DEFAULT_METRIC},
        },
    }
    page = {"type": "string"}
    return {
        "summary": "The demo page's scoring form: each sentence's score and a bar per token, as the page",
        "tags": ["demo"],
        "requestBody": {"required": True, "content": {"application/x-www-form-urlencoded": {"schema": form}}},
        "responses": {
            status: ok(description, HTML, page)
            for status, description in (
                ("200", "The page with the scores."),
                ("422", "The page with the problem shown next to the field."),
                ("500", "The page saying the model failed on these sentences."),
                ("503", "The page saying the server is busy or restarting."),
                ("504", "The page saying the answer was not ready in time."),
            )
        }
        | {
            "400": error("The form cannot be read (not UTF-8, a broken multipart body)."),
            **_body_refusals(settings, "The form"),
        },
    }


def demo_redirect_operation() -> Schema:
    return {
        "summary": "A reload of an answered page: back to the page itself",
        "tags": ["demo"],
        "responses": {
            "303": {
                "description": "Redirect to `/`, the query kept.",
                "headers": {"Location": header("The page's URL.", required=True)},
            }
        },
    }


# -- each route's operation: the route table (http/routes.py) names one of these for each route ---------


def fixed(operation: Schema) -> Describe:
    """An operation that does not depend on the settings or the model."""
    return lambda settings, mask_token: operation


def for_model(describe: Describe, what: str) -> Describe:
    """``describe`` (an operation on the default model) for the model its path names."""
    return lambda settings, mask_token: _for_model(describe(settings, mask_token), what)


def versioned(describe: Describe) -> Describe:
    """``describe`` on the path that also names the model's version."""
    return lambda settings, mask_token: _versioned(describe(settings, mask_token))
