"""rpc/tracing.py with the OpenTelemetry SDK's in-memory exporter: a call's server span continues
the traceparent in its metadata, carries the RPC's attributes, the model and an error's kind, and
the request's steps and its forward pass hang from it (the batch span links back to it)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from maskserve.config.settings import Settings
from maskserve.http.app import create_app
from tests.live_server import free_port
from tests.unit.middleware.test_request_tracing import PARENT_ID, TRACE_ID, TRACEPARENT, exporter
from tests.unit.rpc.test_servicer import raw_request

__all__ = ["exporter"]  # the fixture, used here by name


async def test_a_call_continues_its_trace_with_its_steps_and_batch(
    aiohttp_client: Any, bert_engine: Any, exporter: InMemorySpanExporter
) -> None:
    port = free_port()
    settings = Settings(traces_exporter="console", warmup=False, grpc_port=port)
    http = await aiohttp_client(create_app(settings, engine=bert_engine))
    from tritonclient.grpc import service_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        await stub.ModelInfer(
            raw_request(["Paris is the [MASK] of France."], raw=True), metadata=(("traceparent", TRACEPARENT),)
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.ModelInfer(raw_request(["no mask"], raw=True))
    await http.close()  # flushes the provider
    spans = exporter.get_finished_spans()
    [call, failed] = [s for s in spans if s.name == "inference.GRPCInferenceService/ModelInfer"]
    assert call.kind == SpanKind.SERVER
    assert f"{call.context.trace_id:032x}" == TRACE_ID and f"{call.parent.span_id:016x}" == PARENT_ID
    attributes = dict(call.attributes or {})
    assert attributes["rpc.system"] == "grpc" and attributes["rpc.method"] == "ModelInfer"
    assert attributes["maskserve.model"] == "maskserve" and attributes["rpc.grpc.status_code"] == 0
    children = {s.name for s in spans if s.parent is not None and s.parent.span_id == call.context.span_id}
    assert "maskserve.parse" in children
    batches = [s for s in spans if s.name == "maskserve.batch"]
    assert any(link.context.span_id == call.context.span_id for batch in batches for link in batch.links)
    failed_attributes = dict(failed.attributes or {})
    assert failed_attributes["error.type"] == "no_mask_token" and failed_attributes["rpc.grpc.status_code"] == 3
