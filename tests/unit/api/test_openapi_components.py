"""openapi_components.py without HTTP: the component schemas follow the live Settings and accept
what the server answers, every error kind is listed, and the response and header builders."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from maskserve.api.openapi_components import (
    JSON,
    REQUEST_ID,
    component_schemas,
    error,
    error_kinds,
    header,
    ok,
    ref,
    retry_after,
    timing_headers,
)
from maskserve.config.bounds import settings_from
from maskserve.config.settings import Settings
from maskserve.errors import MaskserveError, NoMaskToken, Overloaded, ResponseTooLarge
from maskserve.middleware.error_sanitizer import REQUEST_ID_HEADER
from maskserve.tasks.fill_mask_request import FillMaskRequest, request_schema
from maskserve.tasks.oip_tensors import InferRequest, infer_request_schema, infer_response
from maskserve.tasks.score_request import score_request_schema

LIMITS = {"max_inputs": 7, "max_top_k": 9, "max_score_tokens": 11}


def validator(schemas: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """A validator of component ``name`` that resolves the ``#/components/schemas/...`` references."""
    document = {"components": {"schemas": schemas}}
    registry: Registry[Any] = Registry().with_resource(
        "urn:components", Resource.from_contents(document, default_specification=DRAFT202012)
    )
    return jsonschema.Draft202012Validator({"$ref": f"urn:components#/components/schemas/{name}"}, registry=registry)


def prediction(score: float = 0.5) -> dict[str, Any]:
    return {"score": score, "token": 7, "token_str": "city", "sequence": "paris is the city of france."}


def test_ref_points_into_the_components() -> None:
    assert ref("Error") == {"$ref": "#/components/schemas/Error"}


def test_the_request_schemas_are_the_ones_the_parsers_validate_with() -> None:
    settings = settings_from(LIMITS)
    schemas = component_schemas(settings)
    assert schemas["FillMaskRequest"] == request_schema(settings)
    assert schemas["ScoreRequest"] == score_request_schema(settings)
    assert schemas["InferRequest"] == infer_request_schema(settings)


def test_response_limits_follow_the_settings() -> None:
    schemas = component_schemas(settings_from(LIMITS))
    assert schemas["Predictions"]["maxItems"] == 9
    assert schemas["FillMaskResponse"]["anyOf"][1]["maxItems"] == 7
    assert schemas["ScoreResponse"]["anyOf"][1]["maxItems"] == 7
    assert schemas["TextScore"]["properties"]["tokens"]["maxItems"] == 11
    assert component_schemas(Settings())["Predictions"]["maxItems"] == Settings().max_top_k


def test_every_reference_names_a_component() -> None:
    schemas = component_schemas(Settings())
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                found.append(node["$ref"].removeprefix("#/components/schemas/"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schemas)
    assert found and set(found) <= set(schemas)


@pytest.mark.parametrize(
    "answer",
    [
        [prediction()],  # one text, one mask
        [[prediction()], [prediction(0.2)]],  # one text, two masks
        [[prediction()], [[prediction()], [prediction()]]],  # a list of texts
    ],
    ids=["one mask", "several masks", "a list of texts"],
)
def test_every_shape_of_the_pipelines_answer_is_a_fill_mask_response(answer: Any) -> None:
    validator(component_schemas(Settings()), "FillMaskResponse").validate(answer)


def test_more_predictions_than_max_top_k_is_not_a_fill_mask_response() -> None:
    schemas = component_schemas(settings_from({"max_top_k": 2}))
    assert not validator(schemas, "FillMaskResponse").is_valid([prediction()] * 3)


def test_a_prediction_with_a_key_the_pipeline_never_sends_is_refused() -> None:
    check = validator(component_schemas(Settings()), "Prediction")
    assert check.is_valid(prediction() | {"tokens": [7, 8]})  # a whole word's candidate
    assert not check.is_valid(prediction() | {"logit": 3.0})
    assert not check.is_valid(prediction(score=1.5))


def test_a_score_response_is_one_text_score_or_a_list_of_them() -> None:
    check = validator(component_schemas(Settings()), "ScoreResponse")
    one = {"score": -3.5, "windows": 1, "tokens": [{"token": 7, "token_str": "city", "score": -1.0}]}
    assert check.is_valid(one) and check.is_valid([one, {"score": -0.1, "windows": 3}])
    assert not check.is_valid({"score": 0.5, "windows": 1})  # a log-probability is never positive
    assert not check.is_valid({"score": -0.5})  # every answer says how many windows it took
    assert not check.is_valid({"score": -0.5, "windows": 0})
    assert not check.is_valid([])


def test_the_error_schema_knows_every_kind_of_the_error_tree() -> None:
    kinds = error_kinds()
    assert kinds == sorted(set(kinds))
    for cls in (MaskserveError, NoMaskToken, Overloaded, ResponseTooLarge):
        assert cls.kind in kinds
    check = validator(component_schemas(Settings()), "Error")
    body = {"error": "no mask", "error_type": NoMaskToken.kind, "request_id": "r1", "field": "inputs"}
    assert check.is_valid(body)
    assert not check.is_valid(body | {"error_type": "made_up"})
    assert not check.is_valid(body | {"retry_after": 0})


def test_an_infer_response_the_server_makes_is_an_infer_response() -> None:
    fill = FillMaskRequest(texts=("a [MASK]",), batched=True, top_k=1, targets=None)
    body, _ = infer_response("maskserve", InferRequest(fill, "r1", False), [json.dumps([prediction()]).encode()])
    check = validator(component_schemas(Settings()), "InferResponse")
    answer = json.loads(body)
    assert check.is_valid(answer)
    assert not check.is_valid(answer | {"outputs": []})


def test_header_defaults_to_an_optional_string() -> None:
    assert header("why") == {"description": "why", "required": False, "schema": {"type": "string"}}
    assert header("n", {"type": "integer"}, required=True)["schema"] == {"type": "integer"}
    assert REQUEST_ID["required"] is True


def test_an_error_response_carries_the_request_id_and_the_error_schema() -> None:
    response = error("Overloaded.", retry_after())
    assert response["description"] == "Overloaded."
    assert response["content"] == {JSON: {"schema": ref("Error")}}
    assert response["headers"][REQUEST_ID_HEADER] == REQUEST_ID
    assert response["headers"]["Retry-After"]["required"] is True
    assert set(error("Bad.")["headers"]) == {REQUEST_ID_HEADER}


def test_an_ok_response_carries_the_request_id_and_its_own_headers() -> None:
    response = ok("Filled.", JSON, ref("FillMaskResponse"), **timing_headers())
    assert response["content"] == {JSON: {"schema": ref("FillMaskResponse")}}
    assert set(response["headers"]) == {REQUEST_ID_HEADER, "X-Queue-Time-Ms", "X-Inference-Time-Ms", "X-Batch-Size"}
