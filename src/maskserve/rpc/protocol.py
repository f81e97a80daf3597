"""The protocol's messages, built from ``inference.proto`` at import, in a descriptor pool of their own.

The ``.proto`` is compiled once into ``inference.binpb`` (a FileDescriptorSet, committed beside
it with the command in its header), and the message classes are made from it here, not generated
as ``_pb2`` modules. Why: generated modules register their messages in protobuf's process-wide
pool and pin the protobuf release that generated them; ``tritonclient.grpc`` registers the same
names (``inference.ModelInferRequest``...) in that pool, so a process holding both (a test, an
application embedding maskserve beside the client) would fail at import. A pool of maskserve's own
holds any protobuf release's classes and collides with nothing.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"
DESCRIPTORS = "inference.binpb"


def _pool() -> Any:
    pool = descriptor_pool.DescriptorPool()
    compiled = resources.files(__package__).joinpath(DESCRIPTORS).read_bytes()
    for file in descriptor_pb2.FileDescriptorSet.FromString(compiled).file:
        pool.Add(file)
    # The health and reflection services' own files too, so that reflection describes every
    # service this server answers (their message classes stay the packages' own).
    for module in (health_pb2, reflection_pb2):
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb))
    return pool


POOL = _pool()


def message(name: str) -> Any:
    """The message class of ``inference.<name>`` (``Outer.Inner`` for a nested one)."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


@functools.cache
def method_types(method: str) -> tuple[Any, Any]:
    """The request and response classes of one of the service's methods (looked up once each)."""
    found = POOL.FindServiceByName(SERVICE).FindMethodByName(method)
    return message_factory.GetMessageClass(found.input_type), message_factory.GetMessageClass(found.output_type)


def method_names() -> list[str]:
    """Every method the service declares, in the ``.proto``'s order."""
    return [method.name for method in POOL.FindServiceByName(SERVICE).methods]


ModelInferRequest = message("ModelInferRequest")
ModelInferResponse = message("ModelInferResponse")
InferParameter = message("InferParameter")
ModelStreamInferResponse = message("ModelStreamInferResponse")
ModelConfig = message("ModelConfig")
