"""What REST and gRPC share of the model repository (request/model_repository.py): a load's
settings, and the server across workers: a change applied on every sibling, a sibling's refusal
as its own kind, and one index merged from every worker's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from maskserve.errors import InvalidInput, ModelConfigInvalid, ModelLoadFailed, ModelsMemoryExceeded
from maskserve.request.model_repository import ACTOR_HEADER, PEER_HEADER, everywhere, load_overrides, merged_index
from maskserve.service.registry import FillMaskService


class FakePeers:
    """Siblings that answer from a table, and remember what they were sent."""

    worker = "0"

    def __init__(self, answers: list[tuple[str, int, bytes]]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def expositions(self) -> list[tuple[str, bytes]]:
        return []

    async def forward(self, path: str, body: bytes, headers: dict[str, str]) -> list[tuple[str, int, bytes]]:
        self.sent.append((path, body, headers))
        return self.answers


def entry(name: str, state: str = "READY", reason: str = "") -> dict[str, Any]:
    found = {"name": name, "version": "1", "state": state}
    return found | ({"reason": reason} if reason else {})


def error_body(kind: str, message: str) -> bytes:
    return json.dumps({"error": message, "error_type": kind, "request_id": "r"}).encode()


def test_a_loads_config_becomes_settings_and_model_files_are_refused() -> None:
    assert load_overrides("beta", {"config": '{"max_top_k": 3}'}) == {"max_top_k": 3}
    assert load_overrides("beta", {}) is None
    with pytest.raises(InvalidInput, match="files cannot be sent") as sent:
        load_overrides("beta", {"file:1/model.onnx": "d2VpZ2h0cw=="})
    assert sent.value.field == "parameters.file:1/model.onnx"
    with pytest.raises(ModelConfigInvalid, match="model 'beta': the load's config is not JSON"):
        load_overrides("beta", {"config": "{"})


async def test_a_change_runs_here_and_on_every_sibling_and_a_refusal_keeps_its_kind() -> None:
    service = FillMaskService.__new__(FillMaskService)
    ran: list[str] = []

    async def here() -> None:
        ran.append("here")

    service.peers = FakePeers([("1", 200, b""), ("2", 507, error_body("models_memory_exceeded", "no room"))])
    with pytest.raises(ModelsMemoryExceeded, match="worker 2: no room"):
        await everywhere(service, "/v2/repository/models/beta/load", b"{}", "Bearer k", here, actor="tester")
    path, body, headers = service.peers.sent[0]
    assert ran == ["here"] and path.endswith("/load") and body == b"{}"
    assert headers[PEER_HEADER] == "1" and headers[ACTOR_HEADER] == "tester" and headers["Authorization"] == "Bearer k"
    service.peers = FakePeers([("1", 0, b"")])
    with pytest.raises(ModelLoadFailed, match="worker 1: answered nothing"):
        await everywhere(service, "/v2/repository/models/beta/unload", b"{}", None, here, actor="tester")
    # Forwarded by a sibling: applied here only.
    await everywhere(service, "/x", b"", None, here, actor="tester", forwarded=True)
    assert ran == ["here"] * 3 and len(service.peers.sent) == 1


async def test_the_index_is_merged_from_every_worker() -> None:
    mine = [entry("alpha"), entry("beta"), entry("gamma", "UNAVAILABLE", "not loaded")]
    sibling = [entry("alpha"), entry("beta", "LOADING", "loading"), entry("gamma", "UNAVAILABLE", "not loaded")]
    peers = FakePeers([("1", 200, json.dumps(sibling).encode())])
    merged = {e["name"]: e for e in await merged_index(peers, mine, ready=False)}
    assert merged["alpha"] == entry("alpha") and merged["gamma"] == entry("gamma", "UNAVAILABLE", "not loaded")
    assert merged["beta"]["state"] == "LOADING"
    assert merged["beta"]["reason"] == "worker 0: READY; worker 1: LOADING (loading)"
    # Ready only where every worker has it ready; a worker that does not answer knows nothing.
    peers = FakePeers([("1", 200, json.dumps([entry("alpha")]).encode())])
    assert [e["name"] for e in await merged_index(peers, [entry("alpha"), entry("beta")], ready=True)] == ["alpha"]
    silent = {e["name"]: e for e in await merged_index(FakePeers([("1", 0, b"")]), [entry("alpha")], ready=False)}
    assert silent["alpha"]["reason"] == "worker 0: READY; worker 1: unknown (no answer)"
