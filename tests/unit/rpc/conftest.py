"""A maskserve app under test with its gRPC server on, and the clients that call it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from tritonclient.grpc import service_pb2_grpc

from maskserve.model_api import FillMaskModel
from tests.conftest import ClientFactory
from tests.live_server import free_port

Client = TestClient[web.Request, web.Application]


@dataclass
class GrpcApp:
    """The app's HTTP test client, its gRPC address, and a raw stub of the protocol on a channel
    of the test's loop (tritonclient's own generated stub: the client side of the same .proto)."""

    http: Client
    address: str
    channel: grpc.aio.Channel
    stub: Any


GrpcFactory = Callable[..., Awaitable[GrpcApp]]


@pytest.fixture
async def make_grpc(make_client: ClientFactory) -> AsyncIterator[GrpcFactory]:
    """``await make_grpc(engine=..., **settings)``: ``make_client``'s app with ``--grpc-port`` on."""
    channels: list[grpc.aio.Channel] = []

    async def make(engine: FillMaskModel | None = None, **overrides: Any) -> GrpcApp:
        port = free_port()
        http = await make_client(engine=engine, grpc_port=port, **overrides)
        address = f"127.0.0.1:{port}"
        channel = grpc.aio.insecure_channel(address)
        channels.append(channel)
        return GrpcApp(http, address, channel, service_pb2_grpc.GRPCInferenceServiceStub(channel))

    yield make
    for channel in channels:
        await channel.close()
