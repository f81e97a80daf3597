"""The gRPC server: ``grpc.aio`` in the HTTP server's event loop, on ``--grpc-port``.

Built and started inside the running loop once the models are loaded (``http/app.py`` starts it
in the app's start-up, after the model's context), so a call never meets a model still loading. It
serves ``inference.GRPCInferenceService`` (``servicer.py``), ``grpc.health.v1.Health``
(``health.py``) and server reflection (for grpcurl and other tools; its answers are the
descriptors the server already holds). A method not served is UNIMPLEMENTED, naming it.

One process binds its port alone (``grpc.so_reuseport`` off: a port in use is a start-up error,
not a second server sharing it unseen); with ``--workers`` every worker binds it with
``SO_REUSEPORT``, as they do the HTTP port, and the kernel spreads connections across them.
On a stop it takes no new calls and gives those in flight the drain budget, beside the HTTP drain.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from maskserve.middleware.auth import parse_api_keys
from maskserve.rpc import GrpcPortUnavailable
from maskserve.rpc.calls import Calls, CallSpans
from maskserve.rpc.health import HealthServicer
from maskserve.rpc.protocol import POOL, SERVICE, method_names, method_types
from maskserve.rpc.servicer import InferenceServicer
from maskserve.service.registry import FillMaskService

log = logging.getLogger(__name__)

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
STREAMING = frozenset({"ModelStreamInfer"})


def _not_served(call_details: Any) -> Any:
    async def refuse(requests: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"maskserve does not serve {call_details.method}; it serves {SERVICE} "
            f"({', '.join(method_names())}), {HEALTH_SERVICE} and server reflection",
        )
        yield  # an async generator: the handler of a stream of any kind

    return grpc.stream_stream_rpc_method_handler(refuse)


class _NotServed(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Last of the handlers: any method no other serves."""

    def service(self, handler_call_details: Any) -> Any:
        return _not_served(handler_call_details)


def inference_handlers(servicer: InferenceServicer) -> dict[str, Any]:
    """The service's methods, each with its messages' (de)serializers from the protocol's pool."""
    handlers: dict[str, Any] = {}
    for name in method_names():
        request, response = method_types(name)
        make = grpc.stream_stream_rpc_method_handler if name in STREAMING else grpc.unary_unary_rpc_method_handler
        handlers[name] = make(
            getattr(servicer, name),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
    return handlers


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """One app's gRPC server."""

    def __init__(self, service: FillMaskService, *, spans: CallSpans | None = None, reuse_port: bool = False) -> None:
        settings = service.settings
        keys = tuple(key.encode("utf-8") for key in parse_api_keys(settings.api_key))
        self.calls = Calls(service, keys, spans)
        self.server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 1 if reuse_port else 0),
                # A message is a request body: the same bound as HTTP's (--max-body-bytes). Beyond
                # it gRPC itself answers RESOURCE_EXHAUSTED before anything is parsed.
                ("grpc.max_receive_message_length", settings.max_body_bytes),
                # Answers are bounded by --max-response-bytes before any work, as on HTTP.
                ("grpc.max_send_message_length", -1),
            ]
        )
        # Generic, not registered: which calls grpcio's core matches to registered methods depends on
        # the client and the release (a call it does not match would fall to _NotServed).
        handlers = inference_handlers(InferenceServicer(self.calls))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(service), self.server)
        reflection.enable_server_reflection((SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), self.server, POOL)
        self.server.add_generic_rpc_handlers((_NotServed(),))
        self.address = listen_address(settings.host, settings.grpc_port)
        self.port = 0

    async def start(self) -> None:
        """Bind and start; :class:`GrpcPortUnavailable` when the port cannot be bound."""
        try:
            self.port = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:  # grpc's own "Failed to bind"
            raise GrpcPortUnavailable(f"cannot listen for gRPC on {self.address} ({exc})") from None
        if not self.port:
            raise GrpcPortUnavailable(f"cannot listen for gRPC on {self.address}")
        await self.server.start()
        log.info("serving gRPC (%s) on %s", SERVICE, self.address)

    async def stop(self, grace: float) -> None:
        """Take no new calls; those in flight have ``grace`` seconds, then are cancelled."""
        await self.server.stop(grace)
