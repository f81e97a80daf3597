"""What every RPC goes through (rpc/calls.py): the API key, the request id, the access line, the
metrics' protocol label, and an unexpected failure answered INTERNAL with the request id alone."""

from __future__ import annotations

import logging
import re
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2

from maskserve.rpc.status import REQUEST_ID_KEY
from tests.fakes import ControlledModel
from tests.unit.rpc.conftest import GrpcApp, GrpcFactory
from tests.unit.rpc.test_servicer import failing_call, raw_request, trailer

KEY = "k" * 24


async def test_the_key_guards_every_rpc_but_the_probes(make_grpc: GrpcFactory) -> None:
    app = await make_grpc(api_key=KEY)
    for missing in ((), (("authorization", "Bearer wrong"),), (("authorization", KEY),)):
        error = await failing_call(app, raw_request(["a [MASK]"], raw=True), metadata=missing)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, missing
        assert "API key" in (error.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await app.stub.ServerMetadata(service_pb2.ServerMetadataRequest())
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    auth = (("authorization", f"Bearer {KEY}"),)
    assert (await app.stub.ModelInfer(raw_request(["a [MASK]"], raw=True), metadata=auth)).outputs
    assert (await app.stub.ServerMetadata(service_pb2.ServerMetadataRequest(), metadata=auth)).name == "maskserve"
    # Probes hold no secrets, on gRPC as on HTTP.
    assert (await app.stub.ServerLive(service_pb2.ServerLiveRequest())).live
    assert (await app.stub.ServerReady(service_pb2.ServerReadyRequest())).ready
    assert (await app.stub.ModelReady(service_pb2.ModelReadyRequest(name="maskserve"))).ready


async def test_the_request_id_is_echoed_and_a_forged_one_replaced(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()
    call = app.stub.ModelInfer(raw_request(["a [MASK]"], raw=True), metadata=(("x-request-id", "abc-123"),))
    await call
    assert dict(await call.trailing_metadata())[REQUEST_ID_KEY] == "abc-123"
    forged = app.stub.ModelInfer(raw_request(["a [MASK]"], raw=True), metadata=(("x-request-id", "a b;c <x>"),))
    await forged
    given = dict(await forged.trailing_metadata())[REQUEST_ID_KEY]
    assert re.fullmatch(r"[0-9a-f]{32}", given)


async def test_each_call_has_its_access_line_and_protocol_labelled_series(
    make_grpc: GrpcFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_grpc()
    with caplog.at_level(logging.INFO, logger="maskserve.access"):
        await app.stub.ModelInfer(raw_request(["a [MASK]"], raw=True), metadata=(("x-request-id", "line-1"),))
        await failing_call(app, raw_request(["no mask"], raw=True), metadata=(("x-request-id", "line-2"),))
    lines = [record.getMessage() for record in caplog.records if record.name == "maskserve.access"]
    assert any(
        re.fullmatch(r"line-1 GRPC /inference.GRPCInferenceService/ModelInfer 200 ok [\d.]+ms", x) for x in lines
    )
    assert any(
        line.startswith("line-2 GRPC /inference.GRPCInferenceService/ModelInfer 422 no_mask_token") for line in lines
    )
    counted = await requests_counted(app)
    assert counted[("grpc", "ModelInfer", "200", "ok", "maskserve")] == 1
    assert counted[("grpc", "ModelInfer", "422", "no_mask_token", "maskserve")] == 1
    await app.http.post("/", data="a [MASK]")
    assert (await requests_counted(app))[("http", "fill_mask", "200", "ok", "maskserve")] == 1


async def requests_counted(app: GrpcApp, key: str | None = None) -> dict[tuple[str, ...], float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    text = await (await app.http.get("/metrics", headers=headers)).text()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "maskserve_requests"]
    keys = ("protocol", "route", "status", "kind", "model")
    return {tuple(s.labels[k] for k in keys): s.value for s in family.samples if s.name.endswith("_total")}


async def test_an_unexpected_failure_is_internal_with_the_request_id_and_nothing_else(
    make_grpc: GrpcFactory, caplog: pytest.LogCaptureFixture
) -> None:
    model = ControlledModel()
    app = await make_grpc(engine=model)
    model.encode_error = RuntimeError("secret /opt/model/weights.bin exploded")
    with caplog.at_level(logging.ERROR):
        error = await failing_call(app, raw_request(["a [MASK]"], raw=True), metadata=(("x-request-id", "boom-1"),))
    assert error.code() == grpc.StatusCode.INTERNAL
    details = error.details() or ""
    assert "boom-1" in details and "secret" not in details and "weights" not in details
    assert trailer(error, "x-error-type") == "internal"
    assert "secret /opt/model/weights.bin exploded" in caplog.text  # the log has it whole
    model.encode_error = None
    assert (await app.stub.ModelInfer(raw_request(["a [MASK]"], raw=True))).outputs


async def test_a_stream_needs_the_key_and_a_refused_one_is_counted(make_grpc: GrpcFactory) -> None:
    app = await make_grpc(api_key=KEY)

    async def one() -> Any:
        yield raw_request(["a [MASK]"], raw=True)

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        _ = [answer async for answer in app.stub.ModelStreamInfer(one())]
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    answers = [
        answer async for answer in app.stub.ModelStreamInfer(one(), metadata=(("authorization", f"Bearer {KEY}"),))
    ]
    assert len(answers) == 1 and answers[0].infer_response.outputs and not answers[0].error_message
    counted = await requests_counted(app, KEY)
    assert counted[("grpc", "ModelStreamInfer", "401", "unauthorized", "")] == 1
    assert counted[("grpc", "ModelStreamInfer", "200", "ok", "maskserve")] == 1
