"""The standard ``grpc.health.v1.Health`` service, answered from the server's readiness.

``Check`` answers SERVING while ``/readyz`` would answer 200 (loaded, not draining, not stuck), so a
Kubernetes gRPC probe sees what an HTTP probe sees; NOT_SERVING otherwise. The service names known
are ``""`` (the server) and ``inference.GRPCInferenceService``; any other is NOT_FOUND, as the
standard says. ``Watch`` sends the status, then each change, until the client leaves or the server
stops. No API key: probes hold no secrets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from maskserve.rpc.protocol import SERVICE
from maskserve.service.health import ready
from maskserve.service.registry import FillMaskService

KNOWN = frozenset({"", SERVICE})
# How often a Watch looks again: readiness changes at a stop signal or a stall, and a probe's
# period is seconds; a tenth of a second costs nothing and shows a drain at once.
WATCH_EVERY_S = 0.1


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """``grpc.health.v1.Health`` over :func:`maskserve.service.health.ready`."""

    def __init__(self, service: FillMaskService) -> None:
        self.service = service

    def _status(self) -> Any:
        serving = health_pb2.HealthCheckResponse.SERVING
        return serving if ready(self.service).ok else health_pb2.HealthCheckResponse.NOT_SERVING

    async def Check(self, request: Any, context: Any) -> Any:
        if request.service not in KNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no service named {request.service!r} here")
        return health_pb2.HealthCheckResponse(status=self._status())

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        if request.service not in KNOWN:
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            return
        last = None
        while True:
            status = self._status()
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(WATCH_EVERY_S)
