"""A ``ModelInferRequest`` as the infer document REST reads (``tasks/oip_tensors.py``), and the
answer as a ``ModelInferResponse``: one parser, one set of checks and messages for both transports.

Texts come in ``raw_input_contents`` (a BYTES tensor in Triton's binary form: each element a 4-byte
little-endian length, then its bytes; what ``tritonclient.grpc`` sends) or in the input's
``contents.bytes_contents``. The answer is raw when the texts came raw, in ``bytes_contents``
otherwise, as Triton answers.
"""

from __future__ import annotations

from typing import Any

from maskserve.config.settings import Settings
from maskserve.errors import InvalidInput
from maskserve.rpc.protocol import ModelInferResponse
from maskserve.tasks.oip_tensors import (
    DATATYPE,
    INPUT_NAME,
    OUTPUT_NAMES,
    InferRequest,
    InferRequestParser,
    encode_bytes_tensor,
)

# The InferParameter oneof's fields, each a scalar the JSON form would hold (ModelRepositoryParameter's
# are among them, but for its bytes_param, which no JSON form carries).
_PARAMETER_FIELDS = ("bool_param", "int64_param", "string_param", "double_param", "uint64_param")


def parameter_value(parameter: Any) -> object:
    """An ``InferParameter``'s (or a ``ModelRepositoryParameter``'s) value, as JSON would carry it
    (None when it holds none)."""
    which = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, which) if which in _PARAMETER_FIELDS else None


def _parameters(parameters: Any) -> dict[str, object]:
    return {name: parameter_value(value) for name, value in parameters.items()}


def infer_document(message: Any) -> tuple[dict[str, Any], bytes, bool]:
    """The request as the JSON document the protocol defines, its raw tensor bytes, and whether
    the texts came raw (then the answer goes raw too)."""
    raw = list(message.raw_input_contents)
    inputs: list[dict[str, Any]] = []
    for tensor in message.inputs:
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        parameters = _parameters(tensor.parameters)
        if parameters:
            item["parameters"] = parameters
        if tensor.HasField("contents"):
            item["data"] = list(tensor.contents.bytes_contents)
        inputs.append(item)
    if raw:
        if len(raw) != len(inputs):
            raise InvalidInput(
                f"raw_input_contents holds {len(raw)} tensors for {len(inputs)} inputs", field="raw_input_contents"
            )
        if inputs and "data" in inputs[0]:
            raise InvalidInput(
                "inputs[0] must carry its texts either in contents or in raw_input_contents", field="inputs[0]"
            )
    document: dict[str, Any] = {"inputs": inputs}
    if inputs and raw:
        inputs[0].setdefault("parameters", {})["binary_data_size"] = len(raw[0])
    elif inputs and "data" in inputs[0]:
        inputs[0]["data"] = _texts(inputs[0]["data"])
    if message.id:
        document["id"] = message.id
    parameters = _parameters(message.parameters)
    if parameters:
        document["parameters"] = parameters
    outputs = [{"name": output.name} for output in message.outputs]
    if outputs:
        document["outputs"] = outputs
    return document, raw[0] if raw else b"", bool(raw)


def _texts(items: list[bytes]) -> list[str]:
    try:
        return [item.decode("utf-8") for item in items]
    except UnicodeDecodeError:
        raise InvalidInput("a text of inputs[0].contents is not valid UTF-8", field="inputs[0].contents") from None


def parse_infer(parser: InferRequestParser, message: Any) -> tuple[InferRequest, bool]:
    """The parsed request (a 4xx naming the field at fault otherwise), and whether to answer raw."""
    document, raw, came_raw = infer_document(message)
    return parser.parse_document(document, raw, schema_holds=schema_holds(message, parser.settings)), came_raw


# The parameters a message may carry and still be known valid without the schema's walk, each with
# the InferParameter field its value must be in. Any other takes the walk.
_PLAIN_PARAMETERS = {"top_k": "int64_param", "targets": "string_param", "tokens": "bool_param"}
# The most dimensions an input's shape may have (the schema's maxItems).
_MAX_DIMENSIONS = 8


def schema_holds(message: Any, settings: Settings) -> bool:
    """Whether the message's document is certainly one the infer schema admits: one input, ``text``,
    BYTES, a shape of 1 to 8 non-negative sizes, no input parameters; at most one output, named as
    served, without parameters; parameters among ``top_k`` (an integer within the limit),
    ``targets`` (a non-empty string) and ``tokens`` (a boolean). The JSON schema's walk costs a
    gRPC call a sizeable share of its CPU; the protobuf message is typed, so these few checks say
    the same for the messages clients send. False sends the message the schema's way."""
    if len(message.inputs) != 1 or len(message.outputs) > 1:
        return False
    tensor = message.inputs[0]
    if tensor.name != INPUT_NAME or tensor.datatype != DATATYPE or len(tensor.parameters):
        return False
    if not 1 <= len(tensor.shape) <= _MAX_DIMENSIONS or min(tensor.shape) < 0:
        return False
    if message.outputs and (message.outputs[0].name not in OUTPUT_NAMES or len(message.outputs[0].parameters)):
        return False
    parameters = message.parameters
    for name in parameters:
        if _PLAIN_PARAMETERS.get(name) != parameters[name].WhichOneof("parameter_choice"):
            return False
    if "top_k" in parameters and not 1 <= parameters["top_k"].int64_param <= settings.max_top_k:
        return False
    return "targets" not in parameters or bool(parameters["targets"].string_param)


def infer_response(model_name: str, version: str, request: InferRequest, texts_json: list[bytes], raw: bool) -> Any:
    """The ``ModelInferResponse``: each text's output element, raw when the texts came raw."""
    response = ModelInferResponse(model_name=model_name, model_version=version, id=request.id or "")
    output = response.outputs.add(name=request.output, datatype=DATATYPE, shape=[len(texts_json)])
    if raw:
        response.raw_output_contents.append(encode_bytes_tensor(texts_json))
    else:
        output.contents.bytes_contents.extend(texts_json)
    return response
