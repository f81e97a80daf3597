"""rpc/protocol.py: the committed descriptor set is what inference.proto compiles to, every message
and field agrees, by number, name and type, with the protocol as tritonclient's own stubs carry
it, and the two live in one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2

from maskserve.rpc import protocol

RPC = Path(protocol.__file__).parent


def test_the_descriptor_set_is_the_proto_compiled(tmp_path: Path) -> None:
    out = tmp_path / "inference.binpb"
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{RPC}", "--include_imports"]
    subprocess.run([*command, f"--descriptor_set_out={out}", str(RPC / "inference.proto")], check=True)
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    committed = descriptor_pb2.FileDescriptorSet.FromString((RPC / protocol.DESCRIPTORS).read_bytes())
    assert compiled == committed, "inference.binpb is stale: run the command in inference.proto's header"


def fields(descriptor: Any) -> dict[str, tuple[int, int, str]]:
    """Each field's number, type and (for messages and enums) type name, by field name."""
    found = {}
    for field in descriptor.fields:
        kind = field.message_type or field.enum_type
        found[field.name] = (field.number, field.type, kind.name if kind is not None else "")
    return found


def messages(descriptor: Any) -> list[Any]:
    return [descriptor, *(inner for nested in descriptor.nested_types for inner in messages(nested))]


def ours() -> list[Any]:
    service = protocol.POOL.FindServiceByName(protocol.SERVICE)
    seen: dict[str, Any] = {}
    pending = [t for m in service.methods for t in (m.input_type, m.output_type)]
    while pending:
        message = pending.pop()
        if message.full_name not in seen:
            seen[message.full_name] = message
            pending.extend(f.message_type for f in message.fields if f.message_type is not None)
            pending.extend(message.nested_types)
    return list(seen.values())


@pytest.mark.parametrize("message", ours(), ids=lambda m: m.full_name)
def test_every_field_agrees_with_the_protocol_tritonclient_speaks(message: Any) -> None:
    theirs = service_pb2.DESCRIPTOR.pool.FindMessageTypeByName(message.full_name)
    declared = fields(theirs)
    for name, field in fields(message).items():
        if field[2].endswith("Entry"):  # a map's entry type: its key and value are checked with it
            assert declared[name][:2] == field[:2], name
        else:
            assert declared[name] == field, f"{message.full_name}.{name}"


def test_the_service_declares_the_methods_triton_numbers_and_answers_them_in_order() -> None:
    theirs = [m.name for m in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
    assert protocol.method_names() == theirs[: len(protocol.method_names())]
    request, response = protocol.method_types("ModelInfer")
    assert request.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    assert response.DESCRIPTOR.full_name == "inference.ModelInferResponse"


def test_maskserves_messages_and_tritonclients_read_each_other() -> None:
    ours_message = protocol.ModelInferRequest(model_name="m", id="7")
    ours_message.parameters["top_k"].int64_param = 3
    ours_message.raw_input_contents.append(b"\x01\x00\x00\x00x")
    theirs = service_pb2.ModelInferRequest.FromString(ours_message.SerializeToString())
    assert (theirs.model_name, theirs.id, theirs.parameters["top_k"].int64_param) == ("m", "7", 3)
    assert protocol.ModelInferRequest.FromString(theirs.SerializeToString()) == ours_message
