"""The Open Inference Protocol (KServe v2) through the real client, ``tritonclient.http``, and raw HTTP:
metadata, health, inference in JSON and in Triton's binary form, parameters, errors; the same
predictions as ``POST /``."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from typing import Any, TypeVar

import jsonschema
import numpy as np
import pytest
import tritonclient.http as triton
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from tritonclient.utils import InferenceServerException

from maskserve.engine import FillMaskEngine
from maskserve.request.keys import SERVICE_KEY
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, wait_for_depth, wait_until_entered
from tests.models import LONG_TEXT
from tests.unit.middleware.test_error_sanitizer import error_of

Client = TestClient[web.Request, web.Application]
T = TypeVar("T")
PARIS = "Paris is the [MASK] of France."
TWO_MASKS = "The [MASK] sat on the [MASK]."


async def in_thread(client: Client, call: Callable[[triton.InferenceServerClient], T]) -> T:
    """Run a tritonclient call (synchronous) against ``client``'s server, off its event loop."""
    address = f"{client.host}:{client.port}"

    def run() -> T:
        with triton.InferenceServerClient(address) as server:
            return call(server)

    return await asyncio.to_thread(run)


def texts_input(texts: list[str], *, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    return tensor


def predictions(result: triton.InferResult) -> list[Any]:
    return [json.loads(item) for item in result.as_numpy("predictions")]


async def post_answers(client: Client, texts: list[str], parameters: dict[str, Any] | None = None) -> list[Any]:
    response = await client.post("/", json={"inputs": texts, "parameters": parameters or {}})
    assert response.status == 200
    answers: list[Any] = await response.json()
    return answers


async def test_tritonclient_reads_metadata_and_health(make_client: ClientFactory) -> None:
    client = await make_client(model_name="fill-mask-bert")

    def ask(server: triton.InferenceServerClient) -> tuple[Any, ...]:
        return (
            server.is_server_live(),
            server.is_server_ready(),
            server.is_model_ready("fill-mask-bert"),
            server.is_model_ready("maskserve"),
            server.get_server_metadata(),
            server.get_model_metadata("fill-mask-bert"),
        )

    live, ready, model_ready, other_ready, server, model = await in_thread(client, ask)
    assert (live, ready, model_ready, other_ready) == (True, True, True, False)
    assert server["name"] == "maskserve" and "binary_tensor_data" in server["extensions"]
    assert model["name"] == "fill-mask-bert" and model["platform"] == "pytorch"
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert model["outputs"] == [
        {"name": name, "datatype": "BYTES", "shape": [-1]} for name in ("predictions", "scores")
    ]
    assert model["parameters"]["mask_token"] == "[MASK]"


@pytest.mark.parametrize("binary", [True, False], ids=["binary tensors", "JSON tensors"])
async def test_tritonclient_gets_the_same_predictions_as_post(make_client: ClientFactory, binary: bool) -> None:
    client = await make_client()
    texts = [PARIS, TWO_MASKS, "She poured a cup of [MASK]."]

    def infer(server: triton.InferenceServerClient) -> list[Any]:
        outputs = [triton.InferRequestedOutput("predictions", binary_data=binary)]
        return predictions(server.infer("maskserve", [texts_input(texts, binary=binary)], outputs=outputs))

    assert await in_thread(client, infer) == await post_answers(client, texts)


async def test_one_text_and_parameters_answer_as_post_does(make_client: ClientFactory) -> None:
    client = await make_client()

    def infer(server: triton.InferenceServerClient) -> list[list[Any]]:
        one = predictions(server.infer("maskserve", [texts_input([PARIS])]))
        chosen = predictions(
            server.infer("maskserve", [texts_input([PARIS])], parameters={"top_k": 2, "targets": "dog,city,cat"})
        )
        return [one, chosen]

    one, chosen = await in_thread(client, infer)
    assert one == await post_answers(client, [PARIS])
    assert chosen == await post_answers(client, [PARIS], {"top_k": 2, "targets": ["dog", "city", "cat"]})
    assert len(chosen[0]) == 2 and {p["token_str"] for p in chosen[0]} <= {"dog", "city", "cat"}


@pytest.mark.parametrize(
    ("call", "status", "message"),
    [
        (lambda s: s.infer("maskserve", [texts_input(["no mask here"])]), "422", "holds no mask token"),
        (lambda s: s.infer("maskserve", [texts_input([PARIS, "no mask"])]), "422", "inputs[0].data[1] holds no mask"),
        (lambda s: s.infer("maskserve", [texts_input([PARIS])], parameters={"top_k": 0}), "422", "top_k"),
        (lambda s: s.infer("bert", [texts_input([PARIS])]), "404", "no model named 'bert'"),
        (lambda s: s.get_model_metadata("bert"), "404", "this server serves 'maskserve'"),
    ],
)
async def test_tritonclient_raises_with_the_servers_message(
    make_client: ClientFactory, call: Callable[[triton.InferenceServerClient], Any], status: str, message: str
) -> None:
    client = await make_client()

    def attempt(server: triton.InferenceServerClient) -> InferenceServerException:
        with pytest.raises(InferenceServerException) as raised:
            call(server)
        return raised.value

    error = await in_thread(client, attempt)
    assert error.status() == status
    assert message in (error.message() or "")


def infer_body(data: Any, shape: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "text", "shape": shape if shape is not None else [len(data)], "datatype": "BYTES", "data": data}
    return {"inputs": [tensor], **extra}


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [PARIS]}]},
            "inputs[0].name",
            '"text"',
        ),
        (
            {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
            "inputs[0].datatype",
            "BYTES",
        ),
        (infer_body([PARIS, PARIS], shape=[3]), "inputs[0].data", "must hold 3 strings"),
        (infer_body([[PARIS], [PARIS]], shape=[2, 1]) | {"parameters": {"top_k": 1000}}, "parameters.top_k", "between"),
        (infer_body([PARIS] * 65), "inputs[0].shape", "send 1 to 64"),
        (infer_body([PARIS], outputs=[{"name": "logits"}]), "outputs[0].name", '"predictions"'),
        ({"inputs": []}, "inputs", 'exactly one input, "text"'),
    ],
)
async def test_a_bad_infer_request_is_422_naming_the_field(
    make_client: ClientFactory, body: dict[str, Any], field: str, message: str
) -> None:
    client = await make_client()
    error = await error_of(await client.post("/v2/models/maskserve/infer", json=body), 422, "invalid_input")
    assert error["field"] == field and message in error["error"]
    assert (await client.post("/v2/models/maskserve/infer", json=infer_body([PARIS]))).status == 200  # still serving


async def test_nested_json_tensors_and_the_request_id_are_honoured(make_client: ClientFactory) -> None:
    client = await make_client()
    body = infer_body([[PARIS], [TWO_MASKS]], shape=[2, 1], id="req-7")
    response = await client.post("/v2/models/maskserve/infer", json=body)
    assert response.status == 200
    answer = await response.json()
    assert answer["id"] == "req-7" and answer["model_name"] == "maskserve"
    (output,) = answer["outputs"]
    assert output["shape"] == [2]
    assert [json.loads(item) for item in output["data"]] == await post_answers(client, [PARIS, TWO_MASKS])
    assert response.headers["X-Batch-Size"]  # the same timing headers as POST /


async def test_broken_binary_framing_is_a_clear_4xx(make_client: ClientFactory) -> None:
    client = await make_client()
    one = struct.pack("<I", len(PARIS)) + PARIS.encode()

    def header(texts: int, size: int) -> bytes:
        tensor = {"name": "text", "shape": [texts], "datatype": "BYTES", "parameters": {"binary_data_size": size}}
        return json.dumps({"inputs": [tensor]}).encode()

    cases = [
        (header(2, len(one)), one, None, 422, "fewer elements"),  # the shape says 2, the data holds 1
        (header(1, len(one) + 4), one + b"\0\0\0\0", None, 422, "more data"),
        (header(1, len(one) - 1), one[:-1], None, 422, "runs past its end"),
        (header(1, len(one)), one, "nonsense", 400, "Inference-Header-Content-Length"),
        (header(1, len(one)), one, "100000", 400, "Inference-Header-Content-Length"),
    ]
    for head, data, length, status, message in cases:
        framing = {"Inference-Header-Content-Length": length or str(len(head))}
        response = await client.post("/v2/models/maskserve/infer", data=head + data, headers=framing)
        assert response.status == status and message in (await response.json())["error"], message


async def test_v2_health_follows_readyz_and_livez(make_client: ClientFactory) -> None:
    client = await make_client()
    assert (await client.get("/v2/health/ready")).status == 200
    client.app[SERVICE_KEY].lifecycle.start_draining()
    ready = await client.get("/v2/health/ready")
    assert ready.status == 400  # the protocol's 4xx for "not ready"
    assert [p["code"] for p in (await ready.json())["problems"]] == ["draining"]
    assert (await client.get("/v2/models/maskserve/ready")).status == 400
    assert (await client.get("/v2/health/live")).status == 200


async def test_infer_is_shed_by_the_breaker_and_probes_need_no_key(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=1, api_key="k" * 16)
    auth = {"Authorization": "Bearer " + "k" * 16}
    url = "/v2/models/maskserve/infer"
    body = infer_body(["a [MASK]"])
    model.hold()
    busy = asyncio.create_task(client.post(url, json=body, headers=auth))
    await wait_until_entered(model)
    queued = asyncio.create_task(client.post(url, json=body, headers=auth))
    await wait_for_depth(default_parts(client).batcher, 1)
    refused = await client.post(url, json=body, headers=auth)
    await error_of(refused, 503, "overloaded")
    for probe in ("/v2/health/live", "/v2/health/ready", "/v2/models/maskserve/ready"):
        assert (await client.get(probe)).status in (200, 400)  # answered without the key
    assert (await client.get("/v2/models/maskserve")).status == 401
    model.release()
    assert [r.status for r in await asyncio.gather(busy, queued)] == [200, 200]


# The REST specification's own response schemas (open_inference_rest.yaml's components, in its
# words, written out here as JSON Schema): what every route must answer, whatever else it adds.
TENSOR_METADATA = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
    },
}
SPEC = {
    "metadata_server_response": {
        "type": "object",
        "required": ["name", "version", "extensions"],
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}},
        },
    },
    "metadata_model_response": {
        "type": "object",
        "required": ["name", "platform"],
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": TENSOR_METADATA},
            "outputs": {"type": "array", "items": TENSOR_METADATA},
        },
    },
    "inference_response": {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "parameters": {"type": "object"},
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "shape", "datatype", "data"],
                    "properties": {
                        "name": {"type": "string"},
                        "shape": {"type": "array", "items": {"type": "integer"}},
                        "datatype": {"type": "string"},
                        "parameters": {"type": "object"},
                        "data": {"type": "array"},
                    },
                },
            },
        },
    },
    # Every error object of the specification (server, model and inference alike).
    "error_response": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
}
# The served model's routes, as the specification lists them: without and with the version.
MODEL_ROUTES = ("/v2/models/maskserve", "/v2/models/maskserve/versions/1")


async def conforms(response: ClientResponse, status: int, schema: str | None) -> Any:
    """The response's JSON, checked against the specification's schema for it."""
    assert response.status == status, await response.text()
    if schema is None:  # a health route: the status is the answer
        return None
    body = await response.json()
    jsonschema.validate(body, SPEC[schema])
    return body


async def test_every_route_of_the_specification_answers_in_its_schema_with_and_without_the_version(
    make_client: ClientFactory,
) -> None:
    client = await make_client()
    for path in ("/v2", "/v2/"):
        server = await conforms(await client.get(path), 200, "metadata_server_response")
        assert server["name"] == "maskserve"
    for path in ("/v2/health/live", "/v2/health/ready"):
        await conforms(await client.get(path), 200, None)
    for model in MODEL_ROUTES:
        versioned = "/versions/" in model
        metadata = await conforms(await client.get(model), 200, "metadata_model_response")
        assert metadata["name"] == "maskserve" and metadata["versions"] == ["1"]
        await conforms(await client.get(model + "/ready"), 200, None)
        answer = await conforms(
            await client.post(model + "/infer", json=infer_body([PARIS, TWO_MASKS], id="req-9")),
            200,
            "inference_response",
        )
        assert answer["id"] == "req-9" and answer["model_name"] == "maskserve"
        # The version answered is the one asked for, and only when asked.
        assert answer.get("model_version") == ("1" if versioned else None)
        assert [json.loads(item) for item in answer["outputs"][0]["data"]] == await post_answers(
            client, [PARIS, TWO_MASKS]
        )
        error = await conforms(await client.post(model + "/infer", json=infer_body(["no mask"])), 422, "error_response")
        assert "no mask token" in error["error"]


@pytest.mark.parametrize(
    "path",
    ["/v2/models/maskserve/versions/2", "/v2/models/maskserve/versions/latest", "/v2/models/bert/versions/1"],
)
async def test_a_version_or_model_not_served_is_404_in_the_error_shape_and_not_ready(
    make_client: ClientFactory, path: str
) -> None:
    client = await make_client()
    for response in (await client.get(path), await client.post(path + "/infer", json=infer_body([PARIS]))):
        error = await error_of(response, 404, "not_found")
        jsonschema.validate(error, SPEC["error_response"])
        assert "this server serves 'maskserve'" in error["error"] or "it serves version '1'" in error["error"]
    # Readiness answers "no" as Triton does, the protocol's 4xx, rather than an error.
    not_ready = await client.get(path + "/ready")
    assert not_ready.status == 400 and [p["code"] for p in (await not_ready.json())["problems"]] == ["not_found"]


async def test_tritonclient_passing_a_model_version_reads_metadata_readiness_and_infers(
    make_client: ClientFactory,
) -> None:
    client = await make_client()

    def ask(server: triton.InferenceServerClient) -> tuple[Any, ...]:
        result = server.infer("maskserve", [texts_input([PARIS])], model_version="1")
        with pytest.raises(InferenceServerException) as wrong:
            server.infer("maskserve", [texts_input([PARIS])], model_version="2")
        return (
            server.get_model_metadata("maskserve", model_version="1"),
            server.is_model_ready("maskserve", model_version="1"),
            server.is_model_ready("maskserve", model_version="2"),
            result.get_response(),
            predictions(result),
            wrong.value,
        )

    metadata, ready, other_ready, response, answer, wrong = await in_thread(client, ask)
    assert metadata["versions"] == ["1"] and (ready, other_ready) == (True, False)
    assert response["model_version"] == "1"
    assert answer == await post_answers(client, [PARIS])
    assert wrong.status() == "404" and "it serves version '1'" in (wrong.message() or "")


async def test_a_long_text_is_read_in_windows_as_post_reads_it_or_refused_when_asked(
    make_client: ClientFactory,
) -> None:
    client = await make_client()
    # The test model reads 128 tokens: masks at both ends of three times that.
    response = await client.post("/v2/models/maskserve/infer", json=infer_body([LONG_TEXT, PARIS]))
    assert response.status == 200, await response.text()
    assert response.headers["X-Text-Windows"] == "2, 1"
    answered = [json.loads(item) for item in (await response.json())["outputs"][0]["data"]]
    posted = await post_answers(client, [LONG_TEXT, PARIS])
    # Batched apart, the same rows may round differently in the last bits.
    assert strip_scores(answered) == strip_scores(posted)
    assert scores_of(answered) == pytest.approx(scores_of(posted), abs=1e-6)
    refused = infer_body([LONG_TEXT], parameters={"long_text": "refuse"})
    response = await client.post("/v2/models/maskserve/infer", json=refused)
    assert response.status == 422 and "reads at most 128" in (await response.json())["error"]


def strip_scores(answers: Any) -> Any:
    """The answers without their scores (predictions at any depth of lists)."""
    if isinstance(answers, list):
        return [strip_scores(item) for item in answers]
    return {key: value for key, value in answers.items() if key != "score"}


def scores_of(answers: Any) -> list[float]:
    if isinstance(answers, list):
        return [score for item in answers for score in scores_of(item)]
    return [answers["score"]]


@pytest.mark.parametrize("binary", [True, False])
async def test_the_scores_output_answers_as_post_score_does(make_client: ClientFactory, binary: bool) -> None:
    client = await make_client()
    texts = ["Paris is the capital of France.", "The cat sat on the mat."]

    def infer(server: triton.InferenceServerClient) -> list[Any]:
        outputs = [triton.InferRequestedOutput("scores", binary_data=binary)]
        result = server.infer(
            "maskserve", [texts_input(texts, binary=binary)], outputs=outputs, parameters={"tokens": True}
        )
        return [json.loads(item) for item in result.as_numpy("scores")]

    scored = await in_thread(client, infer)
    response = await client.post("/score", json={"inputs": texts, "parameters": {"tokens": True}})
    assert response.status == 200
    assert scored == await response.json()
    assert all(len(text["tokens"]) > 3 and text["windows"] == 1 for text in scored)


@pytest.mark.parametrize(
    ("outputs", "parameters", "field", "message"),
    [
        ([{"name": "scores"}], {"top_k": 3}, "parameters.top_k", "a parameter of the 'predictions' output"),
        (None, {"metric": "original"}, "parameters.metric", "a parameter of the 'scores' output"),
        ([{"name": "scores"}], {"metric": "lowest"}, "parameters.metric", "must be one of"),
        ([{"name": "scores"}, {"name": "predictions"}], {}, "outputs", "one output"),
    ],
)
async def test_one_outputs_parameters_on_the_other_are_refused_naming_them(
    make_client: ClientFactory, outputs: Any, parameters: dict[str, Any], field: str, message: str
) -> None:
    client = await make_client()
    body = infer_body([PARIS], parameters=parameters) | ({"outputs": outputs} if outputs else {})
    error = await error_of(await client.post("/v2/models/maskserve/infer", json=body), 422, "invalid_input")
    assert error["field"] == field and message in error["error"], error


async def test_whole_words_answer_as_post_does_and_are_refused_with_targets(
    make_client: ClientFactory, wordpiece_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=wordpiece_engine, max_top_k=1000)
    text = "the [MASK] sat on the house ."
    # Past every one-piece word, so that words of several pieces rank in.
    words = {"whole_words": True, "top_k": len(wordpiece_engine.word_pieces().starts) + 10, "max_word_pieces": 2}

    def infer(server: triton.InferenceServerClient) -> list[Any]:
        return predictions(server.infer("maskserve", [texts_input([text])], parameters=words))

    found = await in_thread(client, infer)
    assert found == await post_answers(client, [text], words)
    assert any(len(p["tokens"]) == 2 for p in found[0]) and all(len(p["tokens"]) <= 2 for p in found[0])
    # A narrower beam is the request's too: the same as POST's with it.
    narrow = {**words, "word_beam": 1}
    body = infer_body([text], parameters=narrow)
    response = await client.post("/v2/models/maskserve/infer", json=body)
    assert response.status == 200
    assert [json.loads(item) for item in (await response.json())["outputs"][0]["data"]] == await post_answers(
        client, [text], narrow
    )
    body = infer_body([text], parameters={"whole_words": True, "targets": "cat"})
    error = await error_of(await client.post("/v2/models/maskserve/infer", json=body), 422, "invalid_input")
    assert error["field"] == "parameters.whole_words"
    body = infer_body([text], parameters={"whole_words": True, "word_beam": 0})
    error = await error_of(await client.post("/v2/models/maskserve/infer", json=body), 422, "invalid_input")
    assert error["field"] == "parameters.word_beam"
    body = infer_body([text], parameters={"whole_words": True}) | {"outputs": [{"name": "scores"}]}
    error = await error_of(await client.post("/v2/models/maskserve/infer", json=body), 422, "invalid_input")
    assert "a parameter of the 'predictions' output" in error["error"]
