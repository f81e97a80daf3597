"""A model repository change on every worker (request/across_workers.py), with siblings that answer
from a table: applied everywhere, undone where it loaded afresh when any worker fails, one index
merged from every worker's, the peer headers honoured on a private socket only, and a worker
joining late serving what its siblings serve."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from maskserve.config.settings import Settings
from maskserve.errors import ModelConfigInvalid, ModelLoadFailed, ModelsMemoryExceeded, NotFound
from maskserve.request.across_workers import (
    ACTOR_HEADER,
    CHANGE_HEADER,
    LOAD_CONFIG_KEY,
    PEER_HEADER,
    UNDO_HEADER,
    forwarded,
    join_siblings,
    load_everywhere,
    merged_index,
    own_index,
    peer_failure,
    unload_everywhere,
)
from maskserve.service.registry import FillMaskService
from tests.unit.request.conftest import Answer, FakeControl, FakePeers, FakeServed


def error_body(kind: str, message: str) -> bytes:
    return json.dumps({"error": message, "error_type": kind, "request_id": "r"}).encode()


def entry(name: str, state: str = "READY", reason: str = "") -> dict[str, Any]:
    found = {"name": name, "version": "1", "state": state}
    return found | ({"reason": reason} if reason else {})


FRESH = json.dumps({"fresh": True}).encode()
RELOADED = json.dumps({"fresh": False}).encode()


def control(service: FillMaskService) -> Any:
    return service.control


async def load(service: FillMaskService, name: str = "beta", overrides: dict[str, Any] | None = None) -> None:
    await load_everywhere(
        service, control(service), name, overrides, body=b"{}", authorization="Bearer k", actor="tester", change="c1"
    )


async def test_a_load_runs_here_and_on_every_sibling_with_the_peer_headers(service: FillMaskService) -> None:
    service.peers = FakePeers(lambda path, headers: [("1", 200, FRESH), ("2", 200, FRESH)])
    await load(service)
    assert "beta" in service.models
    ((path, body, headers),) = service.peers.sent
    assert path == "/v2/repository/models/beta/load" and body == b"{}"
    assert headers[PEER_HEADER] == "1" and headers[ACTOR_HEADER] == "tester" and headers[CHANGE_HEADER] == "c1"
    assert headers["Authorization"] == "Bearer k"


async def test_a_load_that_fails_on_one_worker_is_undone_where_it_loaded_afresh(service: FillMaskService) -> None:
    def siblings(path: str, headers: dict[str, str]) -> list[Answer]:
        if path.endswith("/unload"):
            return [("1", 200, b""), ("2", 200, b"")]
        return [("1", 200, FRESH), ("2", 0, b"")]  # worker 2 did not answer

    service.peers = FakePeers(siblings)
    with pytest.raises(ModelLoadFailed) as failed:
        await load(service)
    assert failed.value.message == (
        "model 'beta' was not loaded on every worker: loaded on worker 0 and undone; "
        "loaded on worker 1 and undone; worker 2: answered nothing"
    )
    assert failed.value.status == 500
    assert "beta" not in service.models
    assert control(service).calls[-1] == ("unload", "beta", None, "undo")
    undo_path, _, undo_headers = service.peers.sent[-1]
    assert undo_path == "/v2/repository/models/beta/unload" and undo_headers[UNDO_HEADER] == "c1"


async def test_a_failure_keeps_its_kind_and_a_reload_is_not_undone(service: FillMaskService) -> None:
    service.models["beta"] = FakeServed()  # type: ignore[assignment]
    full = error_body("models_memory_exceeded", "loading 'beta' needs about 90 MiB (the old model still serves there)")
    service.peers = FakePeers(lambda path, headers: [("1", 507, full)])
    with pytest.raises(ModelsMemoryExceeded) as failed:
        await load(service)
    assert failed.value.message == (
        "model 'beta' was not loaded on every worker: reloaded on worker 0; "
        "worker 1: loading 'beta' needs about 90 MiB (the old model still serves there)"
    )
    assert "beta" in service.models and len(service.peers.sent) == 1  # nothing to undo: a reload


async def test_a_load_refused_everywhere_is_this_workers_own_error(service: FillMaskService) -> None:
    control(service).failing["beta"] = ModelConfigInvalid("model 'beta': max_top_k: invalid value 0")
    bad = error_body("model_config_invalid", "model 'beta': max_top_k: invalid value 0")
    service.peers = FakePeers(lambda path, headers: [("1", 400, bad)])
    with pytest.raises(ModelConfigInvalid, match=r"^model 'beta': max_top_k: invalid value 0$"):
        await load(service)
    assert len(service.peers.sent) == 1


async def test_a_reload_that_fails_here_says_the_old_model_still_serves(service: FillMaskService) -> None:
    service.models["beta"] = FakeServed()  # type: ignore[assignment]
    control(service).failing["beta"] = ModelLoadFailed("loading 'beta' failed: no weights")
    service.peers = FakePeers(lambda path, headers: [("1", 200, RELOADED)])
    with pytest.raises(ModelLoadFailed) as failed:
        await load(service)
    assert failed.value.message == (
        "model 'beta' was not loaded on every worker: worker 0: loading 'beta' failed: no weights "
        "(the old model still serves there); reloaded on worker 1"
    )


async def test_an_unload_that_fails_on_one_worker_says_where_it_was_unloaded(service: FillMaskService) -> None:
    service.models["beta"] = FakeServed()  # type: ignore[assignment]
    service.peers = FakePeers(lambda path, headers: [("1", 0, b"")])
    partly = r"^model 'beta' was not unloaded on every worker: unloaded on worker 0; worker 1: answered nothing$"
    with pytest.raises(ModelLoadFailed, match=partly):
        await unload_everywhere(service, control(service), "beta", authorization=None, actor="t", change="c2")
    assert "beta" not in service.models


async def test_a_change_forwarded_never_names_a_path_other_than_its_models() -> None:
    made = FillMaskService(Settings())
    made.models.clear()
    made.control = FakeControl(made, known=("a b",))  # type: ignore[assignment]
    made.peers = FakePeers(lambda path, headers: [("1", 200, FRESH)])
    await load(made, "a b")
    assert made.peers.sent[0][0] == "/v2/repository/models/a%20b/load"


async def test_the_index_is_merged_from_every_worker() -> None:
    mine = [entry("alpha"), entry("beta"), entry("gamma", "UNAVAILABLE", "not loaded")]
    sibling = [entry("alpha"), entry("beta", "LOADING", "loading"), entry("gamma", "UNAVAILABLE", "not loaded")]
    sibling[0][LOAD_CONFIG_KEY] = {"max_top_k": 3}  # a sibling's own: never in the merged answer
    peers = FakePeers(lambda path, headers: [("1", 200, json.dumps(sibling).encode())])
    merged = {e["name"]: e for e in await merged_index(peers, mine, ready=False)}
    assert merged["alpha"] == entry("alpha") and merged["gamma"] == entry("gamma", "UNAVAILABLE", "not loaded")
    assert merged["beta"]["state"] == "LOADING"
    assert merged["beta"]["reason"] == "worker 0: READY; worker 1: LOADING (loading)"
    # Ready only where every worker has it ready; a worker that does not answer knows nothing.
    peers = FakePeers(lambda path, headers: [("1", 200, json.dumps([entry("alpha")]).encode())])
    assert [e["name"] for e in await merged_index(peers, [entry("alpha"), entry("beta")], ready=True)] == ["alpha"]
    silent = FakePeers(lambda path, headers: [("1", 0, b"")])
    unknown = {e["name"]: e for e in await merged_index(silent, [entry("alpha")], ready=False)}
    assert unknown["alpha"]["state"] == "UNAVAILABLE"
    assert unknown["alpha"]["reason"] == "worker 0: READY; worker 1: unknown (no answer)"


async def test_a_reload_that_failed_on_one_worker_shows_in_the_index() -> None:
    kept = entry("beta", "READY", "reload failed, the old model serves: no weights")
    peers = FakePeers(lambda path, headers: [("1", 200, json.dumps([kept]).encode())])
    (merged,) = await merged_index(peers, [entry("beta")], ready=False)
    assert merged["state"] == "READY"
    assert merged["reason"] == "worker 0: READY; worker 1: READY (reload failed, the old model serves: no weights)"


async def test_a_siblings_own_index_carries_each_served_models_load_config(service: FillMaskService) -> None:
    service.peers = FakePeers(lambda path, headers: [("1", 200, FRESH)])
    await load(service, "beta", {"max_top_k": 3})
    await load(service, "gamma")
    own = {e["name"]: e for e in own_index(service, control(service), ready=False)}
    assert own["beta"][LOAD_CONFIG_KEY] == {"max_top_k": 3}
    assert LOAD_CONFIG_KEY not in own["gamma"] and LOAD_CONFIG_KEY not in own["alpha"]
    # Loaded again otherwise (on demand, say): its folder's own settings.
    service.models["beta"] = FakeServed()  # type: ignore[assignment]
    assert LOAD_CONFIG_KEY not in {e["name"]: e for e in own_index(service, control(service), False)}["beta"]


async def test_a_worker_joining_late_serves_what_its_siblings_serve(service: FillMaskService) -> None:
    service.models["alpha"] = FakeServed()  # type: ignore[assignment]  # named at start
    beta = entry("beta") | {LOAD_CONFIG_KEY: {"max_top_k": 3}}
    held = [entry("alpha", "UNAVAILABLE", "unloaded"), beta, entry("gamma")]
    service.peers = FakePeers(lambda path, headers: [("1", 200, json.dumps(held).encode()), ("2", 0, b"")])
    await join_siblings(service)
    assert set(service.models) == {"beta", "gamma"}
    assert ("load", "beta", {"max_top_k": 3}, "join") in control(service).calls
    assert ("unload", "alpha", None, "join") in control(service).calls
    # Joined: asked again, nothing changes.
    calls = len(control(service).calls)
    await join_siblings(service)
    assert len(control(service).calls) == calls


async def test_a_worker_first_up_loads_nothing(service: FillMaskService) -> None:
    service.models["alpha"] = FakeServed()  # type: ignore[assignment]
    service.peers = FakePeers(lambda path, headers: [("1", 0, b""), ("2", 200, b"not json")])
    await join_siblings(service)
    assert set(service.models) == {"alpha"} and not control(service).calls


class FakeTransport:
    def __init__(self, family: socket.AddressFamily) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.sock if name == "socket" else default


@pytest.mark.parametrize(("family", "honoured"), [(socket.AF_INET, False), (socket.AF_UNIX, True)])
def test_the_peer_header_is_honoured_on_a_private_socket_only(family: socket.AddressFamily, honoured: bool) -> None:
    transport = FakeTransport(family)
    try:
        request = make_mocked_request("POST", "/v2/repository/index", headers={PEER_HEADER: "1"}, transport=transport)
        assert forwarded(request) is honoured
        plain = make_mocked_request("POST", "/v2/repository/index", transport=transport)
        assert not forwarded(plain)
    finally:
        transport.sock.close()


def test_a_siblings_refusal_keeps_its_kind() -> None:
    assert isinstance(peer_failure(404, error_body("not_found", "no model named 'x'")), NotFound)
    assert isinstance(peer_failure(502, b"<html>"), ModelLoadFailed)
