"""rpc/tensors.py: a ModelInferRequest read as the protocol's JSON document (raw texts or
bytes_contents, parameters, outputs), its refusals, and the answer raw or in contents."""

from __future__ import annotations

import json
from typing import Any

import pytest

from maskserve.config.settings import Settings
from maskserve.errors import InvalidInput
from maskserve.rpc.protocol import InferParameter, ModelInferRequest
from maskserve.rpc.tensors import infer_document, infer_response, parse_infer, schema_holds
from maskserve.tasks.fill_mask_request import FillMaskRequest
from maskserve.tasks.oip_tensors import InferRequestParser, encode_bytes_tensor
from maskserve.tasks.score_request import ScoreRequest

PARSER = InferRequestParser(Settings())
TEXTS = ["a [MASK] b", "ünï [MASK]"]


def request(raw: bool = True, texts: list[str] = TEXTS, **fields: Any) -> Any:
    message = ModelInferRequest(model_name="maskserve", **fields)
    tensor = message.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    encoded = [text.encode() for text in texts]
    if raw:
        message.raw_input_contents.append(encode_bytes_tensor(encoded))
    else:
        tensor.contents.bytes_contents.extend(encoded)
    return message


@pytest.mark.parametrize("raw", [True, False])
def test_texts_raw_or_in_contents_parse_alike(raw: bool) -> None:
    message = request(raw, id="r1")
    message.parameters["top_k"].int64_param = 3
    message.parameters["targets"].string_param = "dog,cat"
    parsed, came_raw = parse_infer(PARSER, message)
    assert came_raw is raw and parsed.id == "r1" and parsed.output == "predictions"
    assert isinstance(parsed.request, FillMaskRequest)
    assert parsed.request.texts == tuple(TEXTS) and parsed.request.top_k == 3
    assert parsed.request.targets == ("dog", "cat")


def test_the_scores_output_and_its_parameters() -> None:
    message = request()
    message.outputs.add(name="scores")
    message.parameters["tokens"].bool_param = True
    message.parameters["metric"].string_param = "within_word_l2r"
    parsed, _ = parse_infer(PARSER, message)
    assert isinstance(parsed.request, ScoreRequest) and parsed.output == "scores"
    assert parsed.request.tokens and parsed.request.metric == "within_word_l2r"


def test_the_document_is_what_rest_would_read() -> None:
    document, raw, came_raw = infer_document(request(False))
    assert document == {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS}]}
    assert raw == b"" and not came_raw
    document, raw, came_raw = infer_document(request(True))
    assert document["inputs"][0]["parameters"] == {"binary_data_size": len(raw)} and came_raw


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda m: m.raw_input_contents.append(b"x"), "raw_input_contents", "2 tensors for 1 inputs"),
        (lambda m: m.inputs[0].contents.bytes_contents.append(b"x"), "inputs[0]", "either in contents or in raw"),
        (lambda m: m.inputs[0].shape.__setitem__(0, 3), "inputs[0]", "fewer elements"),
        (lambda m: setattr(m.parameters["top_k"], "string_param", "three"), "parameters.top_k", "top_k"),
    ],
)
def test_a_malformed_message_is_refused_naming_the_field(change: Any, field: str, message: str) -> None:
    parsed = request()
    change(parsed)
    with pytest.raises(InvalidInput) as raised:
        parse_infer(PARSER, parsed)
    assert raised.value.field == field and message in raised.value.message


def test_bad_utf8_in_contents_is_refused() -> None:
    message = request(False)
    message.inputs[0].contents.bytes_contents[0] = b"\xff [MASK]"
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        parse_infer(PARSER, message)


@pytest.mark.parametrize("raw", [True, False])
def test_the_answer_is_raw_when_the_texts_came_raw(raw: bool) -> None:
    parsed, _ = parse_infer(PARSER, request(raw, id="r2"))
    answers = [json.dumps([{"token_str": "x"}]).encode(), b"[]"]
    response = infer_response("maskserve", "1", parsed, answers, raw)
    assert (response.model_name, response.model_version, response.id) == ("maskserve", "1", "r2")
    [output] = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("predictions", "BYTES", [2])
    if raw:
        assert list(response.raw_output_contents) == [encode_bytes_tensor(answers)]
    else:
        assert list(output.contents.bytes_contents) == answers


def variants() -> list[tuple[str, Any]]:
    """Messages around every edge the typed check looks at, each with how it was made."""

    def made(name: str, change: Any, raw: bool = True) -> tuple[str, Any]:
        message = request(raw)
        change(message)
        return name, message

    def parameter(name: str, field: str, value: object) -> Any:
        return lambda m: setattr(m.parameters[name], field, value)

    return [
        made("plain raw", lambda m: None),
        made("plain contents", lambda m: None, raw=False),
        made("top_k 1", parameter("top_k", "int64_param", 1)),
        made("top_k at the limit", parameter("top_k", "int64_param", Settings().max_top_k)),
        made("top_k past the limit", parameter("top_k", "int64_param", Settings().max_top_k + 1)),
        made("top_k 0", parameter("top_k", "int64_param", 0)),
        made("top_k as a string", parameter("top_k", "string_param", "3")),
        made("targets", parameter("targets", "string_param", "dog,cat")),
        made("targets empty", parameter("targets", "string_param", "")),
        made("tokens", parameter("tokens", "bool_param", True)),
        made("tokens as an int", parameter("tokens", "int64_param", 1)),
        made("metric", parameter("metric", "string_param", "nonsense")),
        made("unknown parameter", parameter("temperature", "double_param", 0.5)),
        made("no shape", lambda m: m.inputs[0].ClearField("shape")),
        made("negative size", lambda m: m.inputs[0].shape.__setitem__(0, -1)),
        made("nine dimensions", lambda m: m.inputs[0].shape.extend([1] * 8)),
        made("eight dimensions", lambda m: m.inputs[0].shape.extend([1] * 7)),
        made("another name", lambda m: setattr(m.inputs[0], "name", "image")),
        made("another datatype", lambda m: setattr(m.inputs[0], "datatype", "FP32")),
        made("input parameters", lambda m: setattr(m.inputs[0].parameters["x"], "bool_param", True)),
        made("two inputs", lambda m: m.inputs.add(name="text", datatype="BYTES", shape=[1]), raw=False),
        made("output scores", lambda m: m.outputs.add(name="scores")),
        made("output unknown", lambda m: m.outputs.add(name="logits")),
        made("two outputs", lambda m: (m.outputs.add(name="scores"), m.outputs.add(name="predictions"))),
        made("output parameters", lambda m: m.outputs.add(name="scores").parameters["binary_data"].MergeFrom(
            InferParameter(bool_param=True))),
    ]  # fmt: skip


@pytest.mark.parametrize(("name", "message"), variants(), ids=[name for name, _ in variants()])
def test_the_typed_check_says_valid_only_what_the_schema_admits(name: str, message: Any) -> None:
    document, _, _ = infer_document(message)
    admitted = not list(PARSER._validator.iter_errors(document))
    assert not schema_holds(message, PARSER.settings) or admitted, name
    if name in ("plain raw", "plain contents", "top_k 1", "targets", "tokens", "output scores"):
        assert schema_holds(message, PARSER.settings), name  # what clients send takes the short way
