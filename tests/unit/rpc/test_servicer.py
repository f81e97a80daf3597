"""inference.GRPCInferenceService through the real clients, ``tritonclient.grpc`` (sync and asyncio,
unary and streaming) and a raw stub of the protocol: metadata, configuration, statistics, infer
with raw and JSON-shaped tensors equal to REST's answers, both outputs, and each error status; and
the model repository extension (index, load, unload) with the same control and errors as REST."""

from __future__ import annotations

import asyncio
import json
import queue
import shutil
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from maskserve.engine import FillMaskEngine
from maskserve.request.keys import SERVICE_KEY
from maskserve.rpc.status import ERROR_FIELD_KEY, ERROR_TYPE_KEY, PUSHBACK_KEY, REQUEST_ID_KEY
from maskserve.serving.costs import BatchReport
from tests.conftest import CONTROL_KEY
from tests.fakes import ControlledModel, default_parts, wait_for_depth, wait_until_entered
from tests.unit.rpc.conftest import GrpcApp, GrpcFactory

PARIS = "Paris is the [MASK] of France."
TEXTS = [PARIS, "The [MASK] sat on the [MASK].", "She poured a cup of [MASK]."]


def texts_input(texts: list[str]) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


def same(found: Any, expected: Any) -> bool:
    """Equal answers, scores within float noise: texts batched with different company are computed
    in differently padded passes."""
    if isinstance(expected, dict):
        return found.keys() == expected.keys() and all(same(found[key], expected[key]) for key in expected)
    if isinstance(expected, list):
        return len(found) == len(expected) and all(same(f, e) for f, e in zip(found, expected, strict=True))
    if isinstance(expected, float):
        return bool(found == pytest.approx(expected, rel=1e-4, abs=1e-6))
    return bool(found == expected)


def decoded(result: Any, output: str = "predictions") -> list[Any]:
    return [json.loads(item) for item in result.as_numpy(output)]


async def rest(app: GrpcApp, path: str, texts: list[str], parameters: dict[str, Any] | None = None) -> Any:
    response = await app.http.post(path, json={"inputs": texts, "parameters": parameters or {}})
    assert response.status == 200, await response.text()
    return await response.json()


def raw_request(texts: list[str], *, raw: bool, **fields: Any) -> Any:
    """A ModelInferRequest as a raw stub sends it: texts raw (Triton's framing) or in bytes_contents."""
    request = service_pb2.ModelInferRequest(model_name="maskserve", **fields)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    encoded = [text.encode() for text in texts]
    if raw:
        request.raw_input_contents.append(b"".join(len(item).to_bytes(4, "little") + item for item in encoded))
    else:
        tensor.contents.bytes_contents.extend(encoded)
    return request


async def test_tritonclient_reads_metadata_config_readiness_and_statistics(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()

    def read(address: str) -> dict[str, Any]:
        client = triton.InferenceServerClient(address)
        found = {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "model_ready": client.is_model_ready("maskserve"),
            "version_ready": client.is_model_ready("maskserve", "1"),
            "server": client.get_server_metadata(as_json=True),
            "model": client.get_model_metadata("maskserve", as_json=True),
            "config": client.get_model_config("maskserve", as_json=True)["config"],
        }
        client.infer("maskserve", [texts_input(TEXTS)])
        found["statistics"] = client.get_inference_statistics("maskserve", as_json=True)["model_stats"][0]
        client.close()
        return found

    found = await asyncio.to_thread(read, app.address)
    assert found["live"] and found["ready"] and found["model_ready"] and found["version_ready"]
    assert found["server"]["name"] == "maskserve" and "binary_tensor_data" in found["server"]["extensions"]
    model = found["model"]
    assert model["name"] == "maskserve" and model["versions"] == ["1"] and model["platform"] == "pytorch"
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert [output["name"] for output in model["outputs"]] == ["predictions", "scores"]
    config = found["config"]
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": ["-1"]}]
    assert config["parameters"]["mask_token"] == {"string_value": "[MASK]"}
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    queue_policy = config["dynamic_batching"]["default_queue_policy"]
    assert queue_policy["default_timeout_microseconds"] == "30000000" and queue_policy["max_queue_size"] == 4096
    statistics = found["statistics"]
    assert statistics["name"] == "maskserve" and int(statistics["inference_count"]) >= len(TEXTS)
    assert int(statistics["inference_stats"]["success"]["count"]) >= 1
    assert int(statistics["execution_count"]) >= 1


@pytest.mark.parametrize("raw", [True, False])
async def test_infer_answers_equal_rest_with_raw_and_json_shaped_tensors(make_grpc: GrpcFactory, raw: bool) -> None:
    app = await make_grpc()
    request = raw_request(TEXTS, raw=raw, id="req-7")
    request.parameters["top_k"].int64_param = 3
    response = await app.stub.ModelInfer(request)
    assert response.model_name == "maskserve" and response.id == "req-7"
    [output] = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("predictions", "BYTES", [len(TEXTS)])
    if raw:  # the answer is raw when the texts came raw, in contents otherwise
        assert not output.contents.bytes_contents
        blob, items = response.raw_output_contents[0], []
        while blob:
            length = int.from_bytes(blob[:4], "little")
            items.append(blob[4 : 4 + length])
            blob = blob[4 + length :]
    else:
        assert not response.raw_output_contents
        items = list(output.contents.bytes_contents)
    assert [json.loads(item) for item in items] == await rest(app, "/", TEXTS, {"top_k": 3})


async def test_tritonclient_infers_with_parameters_as_post_does(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()

    def infer(address: str) -> list[Any]:
        client = triton.InferenceServerClient(address)
        try:
            chosen = client.infer("maskserve", [texts_input([PARIS])], parameters={"top_k": 2, "targets": "dog,city"})
            return decoded(chosen)
        finally:
            client.close()

    assert await asyncio.to_thread(infer, app.address) == await rest(
        app, "/", [PARIS], {"top_k": 2, "targets": ["dog", "city"]}
    )


async def test_whole_words_travel_as_request_parameters_and_answer_as_post_does(
    make_grpc: GrpcFactory, wordpiece_engine: FillMaskEngine
) -> None:
    app = await make_grpc(engine=wordpiece_engine, max_top_k=1000)
    text = "the [MASK] sat on the house ."
    # Past every one-piece word, so that words of several pieces rank in.
    words = {"whole_words": True, "top_k": len(wordpiece_engine.word_pieces().starts) + 10, "max_word_pieces": 2}

    def infer(address: str) -> list[Any]:
        client = triton.InferenceServerClient(address)
        try:
            return decoded(client.infer("maskserve", [texts_input([text])], parameters=words))
        finally:
            client.close()

    found = await asyncio.to_thread(infer, app.address)
    assert found == await rest(app, "/", [text], words)
    assert any(len(p["tokens"]) == 2 for p in found[0]) and all(len(p["tokens"]) <= 2 for p in found[0])
    # The raw stub's typed parameters: a narrower beam, as POST answers it; one out of range refused.
    request = raw_request([text], raw=False)
    request.parameters["whole_words"].bool_param = True
    request.parameters["word_beam"].int64_param = 1
    response = await app.stub.ModelInfer(request)
    answer = [json.loads(item) for item in response.outputs[0].contents.bytes_contents]
    assert answer == await rest(app, "/", [text], {"whole_words": True, "word_beam": 1})
    request.parameters["word_beam"].int64_param = 0
    error = await failing_call(app, request)
    assert (
        error.code() == grpc.StatusCode.INVALID_ARGUMENT and trailer(error, ERROR_FIELD_KEY) == "parameters.word_beam"
    )


async def test_the_scores_output_answers_as_post_score_does(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()
    texts = ["Paris is the capital of France.", "The cat sat on the mat."]
    client = triton_aio.InferenceServerClient(app.address)
    try:
        result = await client.infer(
            "maskserve",
            [texts_input(texts)],
            outputs=[triton_aio.InferRequestedOutput("scores")],
            parameters={"tokens": True, "metric": "within_word_l2r"},
        )
    finally:
        await client.close()
    assert decoded(result, "scores") == await rest(app, "/score", texts, {"tokens": True, "metric": "within_word_l2r"})


async def test_the_asyncio_client_infers_and_streams_in_order(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()
    expected = await rest(app, "/", TEXTS)
    client = triton_aio.InferenceServerClient(app.address)
    try:
        unary = decoded(await client.infer("maskserve", [texts_input(TEXTS)]))

        async def requests() -> Any:
            for number, text in enumerate([*TEXTS, "no mask here", PARIS]):
                yield {"model_name": "maskserve", "inputs": [texts_input([text])], "request_id": str(number)}

        answers = [answer async for answer in client.stream_infer(requests())]
    finally:
        await client.close()
    assert unary == expected
    results = [(result.get_response().id, decoded(result)) for result, error in answers if error is None]
    errors = [error for _, error in answers if error is not None]
    # Each request answered in turn, as REST answers that text alone; the bad one answered alone
    # with its error, the stream going on.
    alone = [await rest(app, "/", [text]) for text in [*TEXTS, PARIS]]
    assert [number for number, _ in results] == ["0", "1", "2", "4"]
    assert same([answer for _, answer in results], alone)
    assert len(errors) == 1 and "holds no mask token" in errors[0].message()


async def test_the_sync_client_streams_with_a_callback(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()

    def stream(address: str) -> list[Any]:
        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = triton.InferenceServerClient(address)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            for number, text in enumerate(TEXTS):
                client.async_stream_infer("maskserve", [texts_input([text])], request_id=str(number))
            answers = [got.get(timeout=30) for _ in TEXTS]
        finally:
            client.stop_stream()
            client.close()
        return [(result.get_response().id, decoded(result)) for result, error in answers if error is None]

    streamed = await asyncio.to_thread(stream, app.address)
    assert [number for number, _ in streamed] == ["0", "1", "2"]
    assert same([answer for _, answer in streamed], [await rest(app, "/", [text]) for text in TEXTS])


async def failing_call(app: GrpcApp, request: Any, **call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await app.stub.ModelInfer(request, **call)
    return raised.value


def trailer(error: grpc.aio.AioRpcError, key: str) -> str | None:
    return next((str(value) for name, value in error.trailing_metadata() or () if name == key), None)


@pytest.mark.parametrize(
    ("change", "code", "kind", "field", "message"),
    [
        (
            {"texts": ["no mask here"]},
            grpc.StatusCode.INVALID_ARGUMENT,
            "no_mask_token",
            "inputs[0].data",
            "holds no mask token",
        ),
        ({"top_k": 0}, grpc.StatusCode.INVALID_ARGUMENT, "invalid_input", "parameters.top_k", "top_k"),
        ({"model_name": "bert"}, grpc.StatusCode.NOT_FOUND, "not_found", None, "no model named 'bert'"),
        ({"model_version": "2"}, grpc.StatusCode.NOT_FOUND, "not_found", None, "no version '2'"),
        ({"name": "image"}, grpc.StatusCode.INVALID_ARGUMENT, "invalid_input", "inputs[0].name", '"text"'),
    ],
)
async def test_each_refusal_is_its_status_with_rests_message_and_the_facts_in_trailers(
    make_grpc: GrpcFactory,
    change: dict[str, Any],
    code: grpc.StatusCode,
    kind: str,
    field: str | None,
    message: str,
) -> None:
    app = await make_grpc()
    request = raw_request(change.get("texts", [PARIS]), raw=True)
    if "top_k" in change:
        request.parameters["top_k"].int64_param = change["top_k"]
    if "model_name" in change:
        request.model_name = change["model_name"]
    if "model_version" in change:
        request.model_version = change["model_version"]
    if "name" in change:
        request.inputs[0].name = change["name"]
    error = await failing_call(app, request, metadata=(("x-request-id", "mine-42"),))
    assert error.code() == code and message in (error.details() or ""), error
    assert trailer(error, ERROR_TYPE_KEY) == kind and trailer(error, ERROR_FIELD_KEY) == field
    assert trailer(error, REQUEST_ID_KEY) == "mine-42"
    assert (await app.stub.ModelInfer(raw_request([PARIS], raw=True))).outputs  # still serving


async def test_shed_load_is_unavailable_with_the_computed_wait_as_pushback(make_grpc: GrpcFactory) -> None:
    model = ControlledModel()
    app = await make_grpc(engine=model, max_queue=1)
    model.hold()
    try:
        busy = asyncio.ensure_future(app.stub.ModelInfer(raw_request(["a [MASK]"], raw=True)))
        await wait_until_entered(model)
        queued = asyncio.ensure_future(app.stub.ModelInfer(raw_request(["b [MASK]"], raw=True)))
        await wait_for_depth(default_parts(app.http).batcher, 1)
        error = await failing_call(app, raw_request(["c [MASK]"], raw=True))
    finally:
        model.release()
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "queue" in (error.details() or "")
    assert trailer(error, ERROR_TYPE_KEY) == "overloaded"
    assert int(trailer(error, PUSHBACK_KEY) or 0) >= 1000
    assert all(response.outputs for response in await asyncio.gather(busy, queued))  # the admitted ones answered


async def test_the_calls_deadline_is_the_requests_deadline(make_grpc: GrpcFactory) -> None:
    app = await make_grpc(engine=ControlledModel())
    # As if every pass took 8 s: one text fits the server's 30 s deadline, not a call's 5 s.
    for tokens in (100, 200):
        report = BatchReport(size=10, real_tokens=tokens, padded_tokens=tokens, seconds=8.0, failed=0)
        default_parts(app.http).batcher.cost.observe(report)
    error = await failing_call(app, raw_request(["late [MASK]"], raw=True), timeout=5)
    # The server's refusal at the door, before any work, as REST's for X-Request-Timeout: 5: its
    # message names the call's deadline (not the client library's own timeout).
    rest_refusal = await app.http.post("/", data="late [MASK]", headers={"X-Request-Timeout": "5"})
    assert rest_refusal.status == 503
    assert error.code() == grpc.StatusCode.UNAVAILABLE and trailer(error, ERROR_TYPE_KEY) == "overloaded"
    assert "exceeds this request's deadline (5.0s)" in (error.details() or "")
    assert error.details() == (await rest_refusal.json())["error"]
    assert (await app.stub.ModelInfer(raw_request(["in time [MASK]"], raw=True))).outputs  # no deadline: admitted


@pytest.mark.parametrize("leave", ["cancel", "deadline"])
async def test_a_call_that_ends_while_queued_never_costs_a_forward_pass(make_grpc: GrpcFactory, leave: str) -> None:
    model = ControlledModel()
    app = await make_grpc(engine=model)
    model.hold()
    try:
        busy = asyncio.ensure_future(app.stub.ModelInfer(raw_request(["a [MASK]"], raw=True)))
        await wait_until_entered(model)
        call = app.stub.ModelInfer(raw_request(["gone [MASK]", "left [MASK]"], raw=True), timeout=1.0)
        await wait_for_depth(default_parts(app.http).batcher, 2)
        if leave == "cancel":
            call.cancel()
        with pytest.raises((asyncio.CancelledError, grpc.aio.AioRpcError)):
            await call
        await asyncio.sleep(0.2)  # the server's side of the call ends too
    finally:
        model.release()
    await busy
    assert (await app.stub.ModelInfer(raw_request(["after [MASK]"], raw=True))).outputs
    ran = {ids for batch in model.batches for ids in batch}
    assert model.inner.encode("gone [MASK]") not in ran and model.inner.encode("left [MASK]") not in ran
    assert model.inner.encode("after [MASK]") in ran


async def test_an_unknown_method_is_unimplemented_naming_it(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()
    call = app.channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryStatus")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(b"")
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "does not serve /inference.GRPCInferenceService/SystemSharedMemoryStatus" in (raised.value.details() or "")


async def test_tritonclient_raises_with_the_servers_message(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()

    def attempt(address: str) -> InferenceServerException:
        client = triton.InferenceServerClient(address)
        try:
            with pytest.raises(InferenceServerException) as raised:
                client.infer("maskserve", [texts_input([PARIS, "no mask"])])
            return raised.value
        finally:
            client.close()

    error = await asyncio.to_thread(attempt, app.address)
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "inputs[0].data[1] holds no mask token" in (error.message() or "")


@pytest.mark.parametrize(
    ("texts", "code", "kind"),
    [
        # Two passes of 3 s: past the call's 5 s with admission's margin, within the server's 30 s.
        (40, grpc.StatusCode.DEADLINE_EXCEEDED, "timeout"),
        # Ten passes of 3 s: past any deadline this server allows; sent again it fails again.
        (320, grpc.StatusCode.INVALID_ARGUMENT, "request_too_costly"),
    ],
)
async def test_a_cost_refused_before_any_work_is_its_status(
    make_grpc: GrpcFactory, texts: int, code: grpc.StatusCode, kind: str
) -> None:
    model = ControlledModel()
    app = await make_grpc(engine=model, max_inputs=320, max_batch_size=32)
    for tokens in (100, 200):  # as if every pass took 3 s, whatever its size
        report = BatchReport(size=10, real_tokens=tokens, padded_tokens=tokens, seconds=3.0, failed=0)
        default_parts(app.http).batcher.cost.observe(report)
    error = await failing_call(app, raw_request([f"t{n} [MASK]" for n in range(texts)], raw=True), timeout=5)
    assert error.code() == code and trailer(error, ERROR_TYPE_KEY) == kind, error
    assert not model.batches  # refused before any forward pass


async def test_a_message_past_the_body_limit_is_resource_exhausted(make_grpc: GrpcFactory) -> None:
    app = await make_grpc(max_body_bytes=4096)
    error = await failing_call(app, raw_request(["word " * 2000 + "[MASK]"], raw=True))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await app.stub.ModelInfer(raw_request([PARIS], raw=True))).outputs  # still serving


# -- the model repository extension: RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload --

CONTROL = {"authorization": f"Bearer {CONTROL_KEY}"}
PARIS = "paris is the [MASK] of france."


async def repository_app(make_grpc: GrpcFactory, repository: Path, **overrides: object) -> GrpcApp:
    settings = {"model_control_mode": "explicit", "control_key": CONTROL_KEY} | overrides
    return await make_grpc(model_repository=str(repository), **settings)


def states(index: object) -> dict[str, str]:
    return {model.name: model.state for model in index.models}  # type: ignore[attr-defined]


def text_input(text: str) -> triton.InferInput:
    tensor = triton.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return tensor


async def test_tritonclient_grpc_lists_loads_and_unloads(make_grpc: GrpcFactory, model_repository: Path) -> None:
    app = await repository_app(make_grpc, model_repository)
    async with triton_aio.InferenceServerClient(app.address) as client:
        assert states(await client.get_model_repository_index()) == {
            "alpha": "READY",
            "beta": "UNAVAILABLE",
            "gamma": "UNAVAILABLE",
        }
        assert "model_repository" in (await client.get_server_metadata()).extensions
        await client.load_model("beta", headers=CONTROL, config=json.dumps({"max_top_k": 7}))
        assert await client.is_model_ready("beta")
        answer = await client.infer("beta", [text_input(PARIS)])
        over_grpc = json.loads(answer.as_numpy("predictions")[0])
        over_rest = await (await app.http.post("/models/beta", data=PARIS)).json()
        assert over_grpc == over_rest
        ready = await client.get_model_repository_index()
        assert states(ready)["beta"] == "READY"
        await client.unload_model("beta", headers=CONTROL)
        assert states(await client.get_model_repository_index())["beta"] == "UNAVAILABLE"
        with pytest.raises(InferenceServerException) as gone:
            await client.infer("beta", [text_input(PARIS)])
        assert gone.value.status() == "StatusCode.NOT_FOUND" and "is not loaded" in gone.value.message()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, grpc.StatusCode.UNAUTHENTICATED),
        ({"authorization": "Bearer api-key-0123456789abc"}, grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_control_calls_need_the_control_key(
    make_grpc: GrpcFactory, model_repository: Path, headers: dict[str, str], status: grpc.StatusCode
) -> None:
    app = await repository_app(make_grpc, model_repository, api_key="api-key-0123456789abc")
    async with triton_aio.InferenceServerClient(app.address) as client:
        with pytest.raises(InferenceServerException) as refused:
            await client.load_model("beta", headers=headers)
        assert refused.value.status() == str(status)
        index = await client.get_model_repository_index(headers={"authorization": "Bearer api-key-0123456789abc"})
        assert states(index)["beta"] == "UNAVAILABLE"


async def test_errors_arrive_as_their_statuses(make_grpc: GrpcFactory, model_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(model_repository, tmp_path / "models")
    with open(tmp_path / "models" / "gamma" / "padding.bin", "wb") as padding:
        padding.truncate(2**31)
    app = await repository_app(make_grpc, tmp_path / "models", models_memory="1GiB")
    async with triton_aio.InferenceServerClient(app.address) as client:
        for name, config, status in (
            ("nosuch", None, grpc.StatusCode.NOT_FOUND),
            ("beta", '{"max_batch_size": 0}', grpc.StatusCode.INVALID_ARGUMENT),
            ("gamma", None, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ):
            with pytest.raises(InferenceServerException) as refused:
                await client.load_model(name, headers=CONTROL, config=config)
            assert refused.value.status() == str(status), name
        assert states(await client.get_model_repository_index()) == {
            "alpha": "READY",
            "beta": "UNAVAILABLE",
            "gamma": "UNAVAILABLE",
        }


async def test_with_control_mode_none_the_repository_calls_are_unimplemented(
    make_grpc: GrpcFactory, model_repository: Path
) -> None:
    app = await make_grpc(model_repository=str(model_repository), model=("alpha",), control_key=CONTROL_KEY)
    async with triton_aio.InferenceServerClient(app.address) as client:
        for call in (client.get_model_repository_index(), client.load_model("beta", headers=CONTROL)):
            with pytest.raises(InferenceServerException) as off:
                await call
            assert off.value.status() == "StatusCode.UNIMPLEMENTED" and "--model-control-mode" in off.value.message()
        assert "model_repository" not in (await client.get_server_metadata()).extensions


async def test_on_demand_a_model_infer_loads_its_model(make_grpc: GrpcFactory, model_repository: Path) -> None:
    app = await make_grpc(model_repository=str(model_repository), model_control_mode="on-demand")
    async with triton_aio.InferenceServerClient(app.address) as client:
        answer = await client.infer("gamma", [text_input(PARIS)])
        assert len(json.loads(answer.as_numpy("predictions")[0])) == 5
        assert states(await client.get_model_repository_index())["gamma"] == "READY"


async def wait_for_state(client: Any, name: str, state: str) -> None:
    """Until the index lists ``name`` in ``state`` (generous: a busy machine loads slowly)."""
    for _ in range(3000):
        if states(await client.get_model_repository_index())[name] == state:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} never reached {state}")


async def test_tritonclient_model_ready_is_false_for_a_model_not_serving_and_never_raises(
    make_grpc: GrpcFactory, model_repository: Path
) -> None:
    app = await repository_app(make_grpc, model_repository, warmup=True)

    def readiness() -> dict[str, bool]:
        client = triton.InferenceServerClient(app.address)
        try:
            found = {name: client.is_model_ready(name) for name in ("alpha", "beta", "gamma", "nosuch")}
            return found | {"alpha/2": client.is_model_ready("alpha", "2")}
        finally:
            client.close()

    async with triton_aio.InferenceServerClient(app.address) as client:
        # gamma stays LOADING while the inference thread, where its warm-up passes run, is held.
        held = threading.Event()
        app.http.app[SERVICE_KEY].scheduler.executor.submit(held.wait, 60)
        loading = asyncio.create_task(client.load_model("gamma", headers=CONTROL))
        try:
            await wait_for_state(client, "gamma", "LOADING")
            found = await asyncio.to_thread(readiness)
            assert await client.is_model_ready("gamma") is False  # the asyncio client's too
        finally:
            held.set()
        assert found == {"alpha": True, "beta": False, "gamma": False, "nosuch": False, "alpha/2": False}
        await loading
        assert (await asyncio.to_thread(readiness))["gamma"] is True
        await client.unload_model("gamma", headers=CONTROL)
        assert (await asyncio.to_thread(readiness))["gamma"] is False


async def test_a_stream_error_answer_carries_its_requests_id(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()

    async def requests() -> Any:
        for number, text in enumerate([PARIS, "no mask here", PARIS]):
            request = raw_request([text], raw=True, id=f"req-{number}")
            if number == 2:
                request.model_name = "bert"  # no such model
            yield request

    answers = [answer async for answer in app.stub.ModelStreamInfer(requests())]
    assert [answer.infer_response.id for answer in answers] == ["req-0", "req-1", "req-2"]
    assert [bool(answer.error_message) for answer in answers] == [False, True, True]
    assert "holds no mask token" in answers[1].error_message
    assert "no model named 'bert'" in answers[2].error_message


@pytest.mark.parametrize("change", ["unload", "reload"])
async def test_a_model_released_before_its_call_is_held_is_unavailable_or_served_by_the_reload(
    make_grpc: GrpcFactory, model_repository: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    app = await repository_app(make_grpc, model_repository)
    service = app.http.app[SERVICE_KEY]
    async with triton_aio.InferenceServerClient(app.address) as client:
        await client.load_model("beta", headers=CONTROL)
        old = service.models["beta"]
        if change == "unload":
            await client.unload_model("beta", headers=CONTROL)
        else:
            await client.load_model("beta", headers=CONTROL, config=json.dumps({"max_top_k": 10}))
        assert old.released
        # The call resolves the model as it was a moment before (the race the hold closes).
        stale = [old]
        served = service.served
        monkeypatch.setattr(service, "served", lambda name=None: stale.pop() if stale else served(name))
        if change == "reload":
            answer = await client.infer("beta", [text_input(PARIS)])
            assert len(json.loads(answer.as_numpy("predictions")[0])) == 5 and not stale
            return
        with pytest.raises(InferenceServerException) as gone:
            await client.infer("beta", [text_input(PARIS)])
    assert gone.value.status() == "StatusCode.UNAVAILABLE" and "'beta'" in (gone.value.message() or "")
    assert not stale


class Siblings:
    """Sibling workers that remember what they were sent (and answer every request 200)."""

    worker = "0"

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def expositions(self) -> list[tuple[str, bytes]]:
        return []

    async def forward(self, path: str, body: bytes, headers: dict[str, str]) -> list[tuple[str, int, bytes]]:
        self.sent.append(path)
        return [("1", 200, b"")]


@pytest.mark.parametrize("name", ["small/unload?x=", "../x", "beta/unload?x=", "beta%2F..", ""])
async def test_a_load_of_a_name_that_is_no_model_is_not_found_and_never_forwarded(
    make_grpc: GrpcFactory, model_repository: Path, name: str
) -> None:
    app = await repository_app(make_grpc, model_repository)
    siblings = app.http.app[SERVICE_KEY].peers = Siblings()
    async with triton_aio.InferenceServerClient(app.address) as client:
        for call in (client.load_model(name, headers=CONTROL), client.unload_model(name, headers=CONTROL)):
            with pytest.raises(InferenceServerException) as refused:
                await call
            assert refused.value.status() == "StatusCode.NOT_FOUND"
            assert "in the model repository; it holds 'alpha', 'beta', 'gamma'" in refused.value.message()
    assert siblings.sent == []
