"""oip_tensors.py without HTTP: InferRequestParser on JSON and binary tensors and its refusals, the
BYTES tensor framing, and the shapes infer_response answers in."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from maskserve.config.bounds import settings_from
from maskserve.config.settings import Settings
from maskserve.errors import InvalidBody, InvalidInput
from maskserve.tasks.fill_mask_request import FillMaskRequest
from maskserve.tasks.oip_tensors import (
    HEADER_LENGTH,
    InferRequest,
    InferRequestParser,
    decode_bytes_tensor,
    encode_bytes_tensor,
    infer_response,
)

PARIS = "Paris is the [MASK] of France."
TWO_MASKS = "The [MASK] sat on the [MASK]."
PARSER = InferRequestParser(Settings())


def tensor(data: Any = None, shape: list[int] | None = None, **fields: Any) -> dict[str, Any]:
    """The ``text`` input; ``data`` left out when None."""
    found: dict[str, Any] = {"name": "text", "shape": shape if shape is not None else [len(data)], "datatype": "BYTES"}
    if data is not None:
        found["data"] = data
    return found | fields


def json_body(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def binary_body(texts: list[bytes], **extra: Any) -> tuple[bytes, str]:
    """A body in Triton's binary form, and its header length."""
    blob = encode_bytes_tensor(texts)
    head = json_body(tensor(shape=[len(texts)], parameters={"binary_data_size": len(blob)}), **extra)
    return head + blob, str(len(head))


def request(binary: bool = False, id: str | None = None) -> InferRequest:
    fill = FillMaskRequest(texts=(PARIS,), batched=True, top_k=5, targets=None)
    return InferRequest(request=fill, id=id, binary_output=binary)


def test_json_tensor_texts_are_parsed_as_a_batch_with_the_default_parameters() -> None:
    parsed = PARSER.parse(json_body(tensor([PARIS, TWO_MASKS])), None)
    assert parsed.request.texts == (PARIS, TWO_MASKS)
    assert parsed.request.batched and parsed.request.location == "inputs[0].data"
    assert parsed.request.top_k == Settings().default_top_k and parsed.request.targets is None
    assert parsed.id is None and not parsed.binary_output


def test_a_nested_json_tensor_is_read_in_row_major_order() -> None:
    parsed = PARSER.parse(json_body(tensor([["a [MASK]", "b [MASK]"], ["c [MASK]", "d [MASK]"]], shape=[2, 2])), None)
    assert parsed.request.texts == ("a [MASK]", "b [MASK]", "c [MASK]", "d [MASK]")


def test_binary_tensor_texts_are_decoded_as_utf8() -> None:
    body, length = binary_body([PARIS.encode(), "Zürich est la [MASK].".encode()])
    parsed = PARSER.parse(body, length)
    assert parsed.request.texts == (PARIS, "Zürich est la [MASK].")


def test_top_k_id_and_the_request_id_are_taken_from_the_request() -> None:
    body = json_body(tensor([PARIS]), id="req-1", parameters={"top_k": 3})
    parsed = PARSER.parse(body, None)
    assert parsed.request.top_k == 3 and parsed.id == "req-1"


@pytest.mark.parametrize(
    ("targets", "expected"),
    [("dog, city ,cat", ("dog", "city", "cat")), (["dog", " city"], ("dog", "city")), ("city", ("city",))],
)
def test_targets_are_a_comma_separated_string_or_a_list_stripped(targets: Any, expected: tuple[str, ...]) -> None:
    parsed = PARSER.parse(json_body(tensor([PARIS]), parameters={"targets": targets}), None)
    assert parsed.request.targets == expected


def test_multi_token_targets_passes_through() -> None:
    default = PARSER.parse(json_body(tensor([PARIS])), None).request.multi_token_targets
    other = "first_token" if default != "first_token" else "whole_word"
    parsed = PARSER.parse(json_body(tensor([PARIS]), parameters={"multi_token_targets": other}), None)
    assert parsed.request.multi_token_targets == other


@pytest.mark.parametrize(
    ("extra", "binary"),
    [
        ({}, False),
        ({"parameters": {"binary_data_output": True}}, True),
        ({"outputs": [{"name": "predictions", "parameters": {"binary_data": True}}]}, True),
        # The output's own choice wins over the request-wide one.
        (
            {
                "parameters": {"binary_data_output": True},
                "outputs": [{"name": "predictions", "parameters": {"binary_data": False}}],
            },
            False,
        ),
        ({"parameters": {"binary_data_output": True}, "outputs": [{"name": "predictions"}]}, False),
    ],
)
def test_binary_output_is_asked_for_by_the_output_or_else_the_request(extra: dict[str, Any], binary: bool) -> None:
    assert PARSER.parse(json_body(tensor([PARIS]), **extra), None).binary_output is binary


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (json_body(tensor([PARIS, PARIS], shape=[3])), "inputs[0].data", "must hold 3 strings"),
        (json_body(tensor([PARIS, 7])), "inputs[0].data", "must hold 2 strings"),
        (json_body(tensor(shape=[1])), "inputs[0].data", "needs data"),
        (json_body(tensor([], shape=[0])), "inputs[0].shape", "holds 0 texts; send 1 to 64"),
        (json_body(tensor([PARIS] * 65)), "inputs[0].shape", "holds 65 texts; send 1 to 64"),
        (json_body(tensor([PARIS]), parameters={"targets": ["w"] * 101}), "parameters.targets", "more than 100"),
        (json_body(tensor([PARIS]), parameters={"targets": 5}), "parameters.targets", "comma-separated"),
        (json_body(tensor([PARIS]), parameters={"top_k": 0}), "parameters.top_k", ""),
        (json_body(tensor([PARIS]) | {"name": "image"}), "inputs[0].name", '"text"'),
        (json_body(tensor([PARIS]), tensor([PARIS])), "inputs", 'exactly one input, "text"'),
    ],
)
def test_a_bad_json_request_is_refused_naming_the_field(body: bytes, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        PARSER.parse(body, None)
    assert refused.value.field == field and message in refused.value.message


def test_the_limits_are_the_servers_own() -> None:
    parser = InferRequestParser(settings_from({"max_inputs": 2, "max_top_k": 3}))
    with pytest.raises(InvalidInput, match="send 1 to 2"):
        parser.parse(json_body(tensor([PARIS] * 3)), None)
    with pytest.raises(InvalidInput) as refused:
        parser.parse(json_body(tensor([PARIS]), parameters={"top_k": 4}), None)
    assert refused.value.field == "parameters.top_k"
    assert parser.parse(json_body(tensor([PARIS] * 2), parameters={"top_k": 3}), None).request.top_k == 3


@pytest.mark.parametrize("length", ["nonsense", "0", "-3", "100000"])
def test_a_header_length_that_is_not_within_the_body_is_an_invalid_body(length: str) -> None:
    body, _ = binary_body([PARIS.encode()])
    with pytest.raises(InvalidBody, match=HEADER_LENGTH):
        PARSER.parse(body, length)


def test_binary_data_without_a_size_on_its_input_is_refused() -> None:
    head = json_body(tensor([PARIS]))
    with pytest.raises(InvalidInput, match="no input names its size") as refused:
        PARSER.parse(head + encode_bytes_tensor([PARIS.encode()]), str(len(head)))
    assert refused.value.field == "inputs"


def test_an_input_with_both_data_and_a_binary_size_is_refused() -> None:
    blob = encode_bytes_tensor([PARIS.encode()])
    head = json_body(tensor([PARIS], parameters={"binary_data_size": len(blob)}))
    with pytest.raises(InvalidInput, match="either in data or in binary_data_size"):
        PARSER.parse(head + blob, str(len(head)))


def test_a_binary_size_other_than_what_follows_the_header_is_refused() -> None:
    blob = encode_bytes_tensor([PARIS.encode()])
    head = json_body(tensor(shape=[1], parameters={"binary_data_size": len(blob) + 1}))
    with pytest.raises(InvalidInput, match="all the body holds after it"):
        PARSER.parse(head + blob, str(len(head)))


def test_a_binary_text_that_is_not_utf8_is_refused() -> None:
    body, length = binary_body([b"\xff\xfe [MASK]"])
    with pytest.raises(InvalidInput, match="not valid UTF-8") as refused:
        PARSER.parse(body, length)
    assert refused.value.field == "inputs[0]"


@pytest.mark.parametrize(
    ("blob", "count", "message"),
    [
        (struct.pack("<I", 3) + b"abc", 2, "fewer elements"),
        (struct.pack("<I", 3) + b"ab", 1, "runs past its end"),
        (struct.pack("<I", 3) + b"abc\0", 1, "more data"),
        (b"\1\0", 1, "fewer elements"),
    ],
)
def test_broken_bytes_tensor_framing_is_refused(blob: bytes, count: int, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_bytes_tensor(blob, count)


def test_bytes_tensor_round_trips_including_empty_elements() -> None:
    items = [b"one", b"", "zwei \u00fc".encode()]
    blob = encode_bytes_tensor(items)
    assert blob[:4] == struct.pack("<I", 3)  # little-endian length, then the bytes
    assert decode_bytes_tensor(blob, 3) == items


def test_json_response_carries_each_texts_json_as_a_string() -> None:
    answers = [b'[{"score": 0.5}]', b"[[], []]"]
    body, headers = infer_response("fill-mask", request(), answers)
    assert headers == {"Content-Type": "application/json"}
    assert json.loads(body) == {
        "model_name": "fill-mask",
        "outputs": [
            {"name": "predictions", "datatype": "BYTES", "shape": [2], "data": ['[{"score": 0.5}]', "[[], []]"]}
        ],
    }


def test_response_echoes_the_id_and_names_the_version_only_when_asked() -> None:
    body, _ = infer_response("m", request(id="req-3"), [b"[]"], version="1")
    answer = json.loads(body)
    assert answer["id"] == "req-3" and answer["model_version"] == "1"
    assert "model_version" not in json.loads(infer_response("m", request(), [b"[]"])[0])
    assert "id" not in json.loads(infer_response("m", request(), [b"[]"])[0])


def test_binary_response_is_the_json_header_then_the_bytes_tensor() -> None:
    answers = [b'[{"score": 0.5}]', b"[]"]
    body, headers = infer_response("m", request(binary=True), answers)
    assert headers["Content-Type"] == "application/octet-stream"
    length = int(headers[HEADER_LENGTH])
    header = json.loads(body[:length])
    (output,) = header["outputs"]
    assert "data" not in output and output["shape"] == [2]
    assert output["parameters"] == {"binary_data_size": len(body) - length}
    assert decode_bytes_tensor(body[length:], 2) == answers
