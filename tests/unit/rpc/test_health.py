"""grpc.health.v1.Health (rpc/health.py): SERVING while /readyz would be 200, NOT_SERVING while
draining, NOT_FOUND for a service not here, and a Watch that sees the drain; no key needed."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from maskserve.request.keys import SERVICE_KEY
from tests.unit.rpc.conftest import GrpcFactory

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService"])
async def test_check_follows_readiness_without_a_key(make_grpc: GrpcFactory, service: str) -> None:
    app = await make_grpc(api_key="k" * 24)
    health = health_pb2_grpc.HealthStub(app.channel)
    assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == SERVING
    assert (await app.http.get("/readyz")).status == 200
    app.http.app[SERVICE_KEY].lifecycle.start_draining()
    assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == NOT_SERVING
    assert (await app.http.get("/readyz")).status == 503


async def test_a_service_not_here_is_not_found(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await health_pb2_grpc.HealthStub(app.channel).Check(health_pb2.HealthCheckRequest(service="nope"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_sends_the_status_then_its_change(make_grpc: GrpcFactory) -> None:
    app = await make_grpc()
    watch = health_pb2_grpc.HealthStub(app.channel).Watch(health_pb2.HealthCheckRequest(service=""))
    seen = [(await watch.read()).status]
    app.http.app[SERVICE_KEY].lifecycle.start_draining()
    seen.append((await asyncio.wait_for(watch.read(), 10)).status)
    watch.cancel()
    assert seen == [SERVING, NOT_SERVING]
