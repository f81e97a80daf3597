"""rpc/server.py through ``python -m maskserve``: a gRPC port already taken stops start-up (exit 2,
even when a maskserve holds it: one process never shares its port unseen), server reflection lists
what is served, ``--workers 2`` serves gRPC from every worker, and SIGTERM answers the calls in
flight before the process exits 0."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
from pathlib import Path

import aiohttp
import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.live_server import free_port, maskserve_process, run_maskserve, start_maskserve, wait_until_ready
from tests.system.test_shutdown import QUEUED_BEFORE_SIGTERM, check_drained, deep_queue_texts, wait_until_queue_holds
from tests.unit.rpc.conftest import GrpcFactory
from tests.unit.rpc.test_servicer import raw_request


def test_a_taken_grpc_port_exits_2_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_maskserve("--port", str(free_port()), "--grpc-port", str(port), "--torch-threads", "1")
    assert result.returncode == 2, result.stderr
    assert f"cannot start: cannot listen for gRPC on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_second_maskserve_on_the_same_grpc_port_is_refused(tmp_path: Path) -> None:
    port = free_port()
    with maskserve_process("--grpc-port", str(port), "--torch-threads", "1", log_dir=tmp_path):
        result = run_maskserve("--port", str(free_port()), "--grpc-port", str(port), "--torch-threads", "1")
    assert result.returncode == 2 and "cannot listen for gRPC" in result.stderr, result.stderr


async def test_reflection_lists_every_service_served(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()
    stub = reflection_pb2_grpc.ServerReflectionStub(app.channel)

    async def ask() -> reflection_pb2.ServerReflectionRequest:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        yield reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.ModelInferRequest")

    listed, described = [answer async for answer in stub.ServerReflectionInfo(ask())]
    names = {service.name for service in listed.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names
    # What grpcurl does with them: build the messages from the served descriptors alone, send the
    # docs' JSON request, read the answer.
    pool = descriptor_pool.DescriptorPool()
    for file in described.file_descriptor_response.file_descriptor_proto:
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(file))
    request_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelInferRequest"))
    response_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelInferResponse"))
    text = base64.b64encode(b"Paris is the [MASK] of France.").decode()
    docs_request = {
        "model_name": "maskserve",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "contents": {"bytes_contents": [text]}}],
    }
    call = app.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    answer = response_class.FromString(
        await call(json_format.ParseDict(docs_request, request_class()).SerializeToString())
    )
    [item] = json_format.MessageToDict(answer)["outputs"][0]["contents"]["bytesContents"]  # base64, as grpcurl shows
    predictions = json.loads(base64.b64decode(item))
    assert predictions[0]["token_str"] and "france" in predictions[0]["sequence"]


async def grpc_counts(url: str) -> dict[str, float]:
    """ModelInfer calls answered, by worker, from /metrics (which merges every worker's series)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        text = await response.text()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "maskserve_requests"]
    counts: dict[str, float] = {}
    for sample in family.samples:
        labels = sample.labels
        if sample.name.endswith("_total") and labels["protocol"] == "grpc" and labels["route"] == "ModelInfer":
            counts[labels["worker"]] = counts.get(labels["worker"], 0) + sample.value
    return counts


async def test_with_two_workers_every_worker_serves_grpc(tmp_path: Path) -> None:
    port = free_port()
    server = start_maskserve(
        "--workers", "2", "--grpc-port", str(port), "--torch-threads", "1",
        log_path=tmp_path / "workers.log", own_process_group=True,
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_until_ready, server)
        await asyncio.to_thread(server.wait_for_log, "serving gRPC", 60)
        for _ in range(60):  # each on a new connection, which the kernel spreads across the workers
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                assert (await stub.ModelInfer(raw_request(["a [MASK]"], raw=True))).outputs
            counts = await grpc_counts(server.url)
            if len(counts) == 2:
                break
        assert set(counts) == {"0", "1"}, (counts, server.log())
    finally:
        server.stop()


async def test_sigterm_answers_the_calls_in_flight_then_exits_0(tmp_path: Path) -> None:
    port = free_port()
    server = start_maskserve(
        "--grpc-port", str(port), "--torch-threads", "1", "--max-batch-size", "1", "--drain-delay", "0",
        log_path=tmp_path / "drain.log",
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_until_ready, server)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            texts = deep_queue_texts(60)
            calls = [stub.ModelInfer(raw_request([text], raw=True)) for text in texts]
            tasks = [asyncio.ensure_future(call) for call in calls]
            async with aiohttp.ClientSession() as session:
                assert await wait_until_queue_holds(session, server.url, QUEUED_BEFORE_SIGTERM), "nothing queued"
            server.signal(signal.SIGTERM)
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        exit_code = await asyncio.to_thread(server.wait, 60)
    finally:
        server.kill()
    output = server.log()
    assert exit_code == 0, output
    answered = [o for o in outcomes if isinstance(o, service_pb2.ModelInferResponse)]
    refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert len(answered) + len(refused) == len(texts), outcomes
    # Calls queued at SIGTERM are answered; one that came after intake closed is UNAVAILABLE.
    assert all(error.code() == grpc.StatusCode.UNAVAILABLE for error in refused), refused
    check_drained(output, len(answered))
