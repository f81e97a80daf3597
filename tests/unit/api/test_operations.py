"""The model's OpenAPI operations (api/operations.py): built from the live limits, and bound to a
route for the model its path names or its version."""

from __future__ import annotations

from maskserve.api.operations import (
    MODEL_PARAMETER,
    fill_mask_doc,
    fixed,
    for_model,
    oip_infer_doc,
    score_doc,
    versioned,
)
from maskserve.config.bounds import settings_from


def test_the_fill_mask_operation_states_this_servers_limits_and_mask() -> None:
    settings = settings_from({"max_top_k": 7, "max_inputs": 3, "max_body_bytes": 123457})
    operation = fill_mask_doc(settings, "<mask>")
    assert "<mask>" in repr(operation) and "[MASK]" not in repr(operation)
    assert "at most 3 inputs" in operation["description"] and "top_k from 1 to 7" in operation["description"]
    assert "123457 bytes (--max-body-bytes)" in operation["responses"]["413"]["description"]


def test_an_operation_for_a_named_model_adds_the_name_and_its_404() -> None:
    settings = settings_from({})
    plain = score_doc(settings, "[MASK]")
    named = for_model(lambda s, m: score_doc(s, m), "`POST /score`")(settings, "[MASK]")
    assert "404" not in plain["responses"] and "404" in named["responses"]
    assert named["parameters"][0]["name"] == "name" and named["parameters"][1:] == plain["parameters"]
    assert "`POST /score`" in named["description"]


def test_a_versioned_operation_adds_the_version_after_the_model() -> None:
    settings = settings_from({})
    operation = versioned(oip_infer_doc)(settings, "[MASK]")
    names = [parameter["name"] for parameter in operation["parameters"]]
    assert names[-1] == "version" and MODEL_PARAMETER["name"] in names
    assert "version" in operation["responses"]["404"]["description"]


def test_a_fixed_operation_ignores_the_settings_and_the_model() -> None:
    operation = {"summary": "s", "responses": {}}
    describe = fixed(operation)
    assert describe(settings_from({}), "[MASK]") is operation
    assert describe(settings_from({"max_top_k": 3}), "<mask>") is operation
