"""The model repository extension over REST (api/repository.py), through the real app and the real
loading code: tritonclient's index, load and unload, reloads, on-demand loads, the memory budget,
the control key and names that try to become paths."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import transformers
import tritonclient.http
from aiohttp import web
from aiohttp.test_utils import TestClient
from tritonclient.http.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from maskserve.request.keys import SERVICE_KEY
from maskserve.service.served_model import ServedModel
from tests.conftest import CONTROL_KEY, REPOSITORY_MODELS, ClientFactory

Client = TestClient[web.Request, web.Application]
CONTROL = {"Authorization": f"Bearer {CONTROL_KEY}"}
PARIS = "paris is the [MASK] of france."
MIB = 1024 * 1024


async def explicit(make_client: ClientFactory, repository: Path, **overrides: Any) -> Client:
    """A server of ``repository`` in explicit control (its first model, alpha, preloaded: the test
    engine stands for it, the others load from their folders)."""
    settings = {"model_control_mode": "explicit", "control_key": CONTROL_KEY} | overrides
    return await make_client(model_repository=str(repository), **settings)


def triton(client: Client) -> InferenceServerClient:
    return InferenceServerClient(f"{client.host}:{client.port}")


async def index(client: Client) -> dict[str, dict[str, Any]]:
    response = await client.post("/v2/repository/index")
    assert response.status == 200
    return {entry["name"]: entry for entry in await response.json()}


def changes(client: Client, model: str, action: str, reason: str = "request", result: str = "ok") -> float:
    value = client.app[SERVICE_KEY].metrics.registry.get_sample_value(
        "maskserve_model_changes_total", {"model": model, "action": action, "reason": reason, "result": result}
    )
    return value or 0.0


async def wait_until_active(served: ServedModel, count: int) -> None:
    """Until ``count`` requests of ``served`` are accepted (parsed, queued or in a batch)."""
    for _ in range(1000):
        if served.active == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{served.active} requests accepted, not {count}")


def padded_repository(root: Path, source: Path, sizes: dict[str, int]) -> Path:
    """Copies of the repository's models, each with weights of the given size on disk (a sparse
    file): their measured size is at least that, so a budget's arithmetic is known in advance."""
    for name, size in sizes.items():
        shutil.copytree(source / name, root / name)
        with open(root / name / "padding.bin", "wb") as padding:
            padding.truncate(size)
    return root


async def test_tritonclient_lists_loads_and_unloads_and_answers_stay_pipeline_equal(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    async with triton(client) as tc:
        listed = await tc.get_model_repository_index()
        assert [(m["name"], m["state"]) for m in listed] == [
            ("alpha", "READY"),
            ("beta", "UNAVAILABLE"),
            ("gamma", "UNAVAILABLE"),
        ]
        await tc.load_model("beta", headers=CONTROL)
        assert await tc.is_model_ready("beta")
        assert {m["name"]: m["state"] for m in await tc.get_model_repository_index()}["beta"] == "READY"
        answer = await (await client.post("/models/beta", data=PARIS)).json()
        expected = transformers.pipeline("fill-mask", model=str(model_repository / "beta"), device="cpu")(PARIS)
        assert [a["token_str"] for a in answer] == [e["token_str"] for e in expected]
        assert [a["score"] for a in answer] == pytest.approx([e["score"] for e in expected], abs=1e-5)
        await tc.unload_model("beta", headers=CONTROL)
        assert {m["name"]: m["state"] for m in await tc.get_model_repository_index()}["beta"] == "UNAVAILABLE"
    gone = await client.post("/models/beta", data=PARIS)
    body = await gone.json()
    assert gone.status == 404 and body["error_type"] == "model_not_loaded"
    assert "'beta' is not loaded (UNAVAILABLE: unloaded)" in body["error"] and "/load" in body["error"]
    assert changes(client, "beta", "load") == 1 and changes(client, "beta", "unload") == 1
    # Its series went with it; the metadata lists the extension.
    exposition = (await (await client.get("/metrics")).text()).splitlines()
    kept = [line for line in exposition if 'model="beta"' in line and "maskserve_model_changes" not in line]
    assert not kept and any('model="alpha"' in line for line in exposition)
    assert "model_repository" in (await (await client.get("/v2")).json())["extensions"]


async def test_the_ready_filter_lists_only_the_models_serving(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    response = await client.post("/v2/repository/index", json={"ready": True})
    assert [entry["name"] for entry in await response.json()] == ["alpha"]
    bad = await client.post("/v2/repository/index", json={"ready": "yes"})
    assert bad.status == 422 and (await bad.json())["field"] == "ready"


async def test_the_default_model_unloaded_answers_404_and_loads_again(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    assert (await client.post("/v2/repository/models/alpha/unload", headers=CONTROL)).status == 200
    assert (await client.post("/", data=PARIS)).status == 404
    assert (await client.get("/livez")).status == 200
    # Loaded again from its folder (the test engine that stood for it is gone).
    assert (await client.post("/v2/repository/models/alpha/load", headers=CONTROL)).status == 200
    assert (await client.post("/", data=PARIS)).status == 200


async def test_a_failed_reload_keeps_the_old_model_serving_and_says_why(
    make_client: ClientFactory, model_repository: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(model_repository, repository)
    client = await explicit(make_client, repository)
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    before = await (await client.post("/models/beta", data=PARIS)).json()
    # A setting the override gets wrong, then files that no longer load: both refused, beta serves.
    bad_config = {"parameters": {"config": json.dumps({"max_batch_size": 0})}}
    refused = await client.post("/v2/repository/models/beta/load", json=bad_config, headers=CONTROL)
    assert refused.status == 400 and "max_batch_size" in (await refused.json())["error"]
    # A config the folder cannot load as it stands (the folder's, 409), then one the engine refuses
    # (the server's side, 500).
    (repository / "beta" / "config.json").write_text("{not json", encoding="utf-8")
    broken = await client.post("/v2/repository/models/beta/load", headers=CONTROL)
    assert broken.status == 409 and "config.json" in (await broken.json())["error"]
    (repository / "beta" / "config.json").write_text('{"model_type": "nosuch"}', encoding="utf-8")
    failed = await client.post("/v2/repository/models/beta/load", headers=CONTROL)
    assert failed.status == 500 and (await failed.json())["error_type"] == "model_load_failed"
    entry = (await index(client))["beta"]
    assert entry["state"] == "READY" and entry["reason"].startswith("reload failed, the old model serves")
    assert await (await client.post("/models/beta", data=PARIS)).json() == before
    assert changes(client, "beta", "reload", result="failed") == 3


async def test_a_reload_with_a_config_applies_its_settings(make_client: ClientFactory, model_repository: Path) -> None:
    client = await explicit(make_client, model_repository)
    config = {"parameters": {"config": json.dumps({"max_top_k": 3})}}
    assert (await client.post("/v2/repository/models/beta/load", json=config, headers=CONTROL)).status == 200
    assert client.app[SERVICE_KEY].models["beta"].settings.max_top_k == 3
    too_many = await client.post("/models/beta", json={"inputs": PARIS, "parameters": {"top_k": 4}})
    assert too_many.status == 422


async def test_concurrent_loads_of_one_model_are_one_load(make_client: ClientFactory, model_repository: Path) -> None:
    client = await explicit(make_client, model_repository)
    loads = [client.post("/v2/repository/models/gamma/load", headers=CONTROL) for _ in range(4)]
    assert [response.status for response in await asyncio.gather(*loads)] == [200] * 4
    assert changes(client, "gamma", "load") == 1


async def test_an_unload_answers_every_request_it_had_accepted(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    served = client.app[SERVICE_KEY].models["beta"]
    # Hold the inference thread, so that every request waits in beta's queue when the unload comes.
    held = threading.Event()
    client.app[SERVICE_KEY].scheduler.executor.submit(held.wait, 30)
    requests = [asyncio.create_task(client.post("/models/beta", data=f"the [MASK] {i}.")) for i in range(12)]
    await wait_until_active(served, 12)
    unload = asyncio.create_task(client.post("/v2/repository/models/beta/unload", headers=CONTROL))
    await asyncio.sleep(0.05)
    assert (await index(client))["beta"]["state"] == "UNLOADING" and not unload.done()
    assert (await client.post("/models/beta", data=PARIS)).status == 404  # no new work meanwhile
    held.set()
    assert [response.status for response in await asyncio.gather(*requests)] == [200] * 12
    assert (await unload).status == 200
    assert (await index(client))["beta"]["state"] == "UNAVAILABLE" and served.parts is None


async def test_control_needs_the_control_key_which_the_api_key_does_not_grant(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository, api_key="api-key-0123456789abc")
    api = {"Authorization": "Bearer api-key-0123456789abc"}
    missing = await client.post("/v2/repository/models/beta/load")
    assert missing.status == 401 and "WWW-Authenticate" in missing.headers
    for headers in (api, {"Authorization": "Bearer not-the-control-key-at-all"}):
        refused = await client.post("/v2/repository/models/beta/load", headers=headers)
        assert refused.status == 403 and (await refused.json())["error_type"] == "forbidden"
    assert (await client.post("/v2/repository/index")).status == 401  # the index is the API key's
    assert (await client.post("/v2/repository/index", headers=api)).status == 200
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200


async def test_on_demand_without_a_control_key_refuses_control(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await make_client(model_repository=str(model_repository), model_control_mode="on-demand")
    refused = await client.post("/v2/repository/models/beta/load", headers=CONTROL)
    assert refused.status == 403 and "--control-key" in (await refused.json())["error"]


async def test_names_from_requests_never_become_paths(
    make_client: ClientFactory, model_repository: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(model_repository, repository)
    outside = tmp_path / "outside"
    shutil.copytree(model_repository / "beta", outside)
    os.symlink(outside, repository / "escape")
    client = await explicit(make_client, repository)
    for name in ("escape", "..", "%2e%2e", ".hidden", "..%2Fbeta", "%2Fetc"):
        response = await client.post(f"/v2/repository/models/{name}/load", headers=CONTROL)
        assert response.status == 404, name
    assert "escape" not in await index(client)


async def test_with_control_mode_none_the_extension_is_off(make_client: ClientFactory, model_repository: Path) -> None:
    client = await make_client(model_repository=str(model_repository), model=("alpha",), control_key=CONTROL_KEY)
    for path in ("/v2/repository/index", "/v2/repository/models/beta/load", "/v2/repository/models/beta/unload"):
        response = await client.post(path, headers=CONTROL)
        assert response.status == 404 and (await response.json())["error_type"] == "extension_off"
    assert (await (await client.get("/v2")).json())["extensions"] == ["binary_tensor_data"]


async def test_on_demand_loads_a_model_within_the_requests_deadline(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await make_client(model_repository=str(model_repository), model_control_mode="on-demand")
    too_soon = await client.post("/models/gamma", data=PARIS, headers={"X-Request-Timeout": "0.001"})
    assert too_soon.status == 504 and "loading" in (await too_soon.json())["error"]
    answered = await client.post("/models/beta", data=PARIS)
    assert answered.status == 200 and len(await answered.json()) == 5
    infer = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [PARIS]}]}
    assert (await client.post("/v2/models/gamma/infer", json=infer)).status == 200  # its load went on
    assert changes(client, "beta", "load", reason="on_demand") == 1
    assert (await client.post("/models/nosuch", data=PARIS)).status == 404


async def test_a_load_past_the_budget_evicts_the_least_recently_used_idle_model(
    make_client: ClientFactory, model_repository: Path, tmp_path: Path
) -> None:
    sizes = dict.fromkeys(REPOSITORY_MODELS, 100 * MIB)
    repository = padded_repository(tmp_path, model_repository, sizes)
    client = await explicit(make_client, repository, models_memory="250MiB")
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    for name in ("/models/beta", "/"):  # beta used, then alpha: beta is the least recently used
        assert (await client.post(name, data=PARIS)).status == 200
    assert (await client.post("/v2/repository/models/gamma/load", headers=CONTROL)).status == 200
    states = {name: (entry["state"], entry.get("reason", "")) for name, entry in (await index(client)).items()}
    assert states == {
        "alpha": ("READY", ""),
        "beta": ("UNAVAILABLE", "evicted to make room (--models-memory)"),
        "gamma": ("READY", ""),
    }
    assert changes(client, "beta", "unload", reason="eviction") == 1


async def test_a_load_that_cannot_fit_is_refused_and_unloads_nothing(
    make_client: ClientFactory, model_repository: Path, tmp_path: Path
) -> None:
    repository = padded_repository(tmp_path, model_repository, {"alpha": 100 * MIB, "beta": 300 * MIB})
    client = await explicit(make_client, repository, models_memory="250MiB")
    refused = await client.post("/v2/repository/models/beta/load", headers=CONTROL)
    body = await refused.json()
    assert refused.status == 507 and body["error_type"] == "models_memory_exceeded"
    assert "nothing was unloaded" in body["error"]
    states = {name: entry["state"] for name, entry in (await index(client)).items()}
    assert states == {"alpha": "READY", "beta": "UNAVAILABLE"}
    assert (await client.post("/", data=PARIS)).status == 200
    assert changes(client, "beta", "load", result="refused") == 1


async def test_a_busy_model_is_not_evicted(make_client: ClientFactory, model_repository: Path, tmp_path: Path) -> None:
    repository = padded_repository(tmp_path, model_repository, {"alpha": 100 * MIB, "beta": 200 * MIB})
    client = await explicit(make_client, repository, models_memory="250MiB")
    held = threading.Event()
    client.app[SERVICE_KEY].scheduler.executor.submit(held.wait, 30)
    busy = asyncio.create_task(client.post("/", data=PARIS))
    served = client.app[SERVICE_KEY].models["alpha"]
    await wait_until_active(served, 1)
    refused = await client.post("/v2/repository/models/beta/load", headers=CONTROL)
    assert refused.status == 507
    held.set()
    assert (await busy).status == 200


async def test_a_load_with_model_files_is_refused_naming_the_parameter(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    async with triton(client) as tc:
        with pytest.raises(InferenceServerException, match="files cannot be sent"):
            await tc.load_model("beta", headers=CONTROL, config="{}", files={"file:1/model.onnx": b"weights"})
    assert (await index(client))["beta"]["state"] == "UNAVAILABLE"


async def test_serving_goes_on_through_loads_reloads_and_unloads(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)

    async def change() -> None:
        for _ in range(3):
            for action in ("load", "load", "unload"):  # a load, a reload, an unload
                response = await client.post(f"/v2/repository/models/beta/{action}", headers=CONTROL)
                assert response.status == 200

    async def serve() -> list[int]:
        return [(await client.post("/", data=PARIS)).status for _ in range(15)]

    changing = asyncio.create_task(change())
    statuses = [status for statuses in await asyncio.gather(*(serve() for _ in range(4))) for status in statuses]
    await changing
    assert statuses == [200] * 60
    assert changes(client, "beta", "reload") == 3 and changes(client, "beta", "unload") == 3


async def test_info_shows_each_models_state_and_memory(make_client: ClientFactory, model_repository: Path) -> None:
    client = await explicit(make_client, model_repository, models_memory="2GiB")
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    section = (await (await client.get("/info")).json())["model_repository"]
    assert section["control_mode"] == "explicit" and section["models_memory_bytes"] == 2 * 1024 * MIB
    assert section["models"]["beta"]["state"] == "READY" and section["models"]["beta"]["memory_bytes"] > 0
    assert section["models"]["gamma"] == {"state": "UNAVAILABLE", "reason": "not loaded", "memory_bytes": None}


async def wait_for_state(client: Client, name: str, state: str) -> None:
    """Until the index lists ``name`` in ``state`` (generous: a busy machine loads slowly)."""
    for _ in range(3000):
        if (await index(client))[name]["state"] == state:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} never reached {state}: {(await index(client))[name]}")


async def test_tritonclient_model_ready_is_false_for_a_model_not_serving_and_never_raises(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository, warmup=True)
    address = f"{client.host}:{client.port}"

    def readiness() -> dict[str, bool]:
        with tritonclient.http.InferenceServerClient(address) as tc:
            found = {name: tc.is_model_ready(name) for name in (*REPOSITORY_MODELS, "nosuch")}
            return found | {"alpha/2": tc.is_model_ready("alpha", model_version="2")}

    # gamma stays LOADING while the inference thread, where its warm-up passes run, is held.
    held = threading.Event()
    client.app[SERVICE_KEY].scheduler.executor.submit(held.wait, 60)
    loading = asyncio.create_task(client.post("/v2/repository/models/gamma/load", headers=CONTROL))
    try:
        await wait_for_state(client, "gamma", "LOADING")
        found = await asyncio.to_thread(readiness)
    finally:
        held.set()
    assert found == {"alpha": True, "beta": False, "gamma": False, "nosuch": False, "alpha/2": False}
    assert (await loading).status == 200
    assert (await asyncio.to_thread(readiness))["gamma"] is True
    assert (await client.post("/v2/repository/models/gamma/unload", headers=CONTROL)).status == 200
    assert (await asyncio.to_thread(readiness))["gamma"] is False


async def test_a_model_not_serving_is_not_ready_400_saying_why(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    for path, code, why in (
        ("/v2/models/beta/ready", "model_not_loaded", "is not loaded (UNAVAILABLE"),
        ("/v2/models/nosuch/ready", "not_found", "no model named 'nosuch'"),
        ("/v2/models/alpha/versions/2/ready", "not_found", "no version '2'"),
    ):
        response = await client.get(path)
        assert response.status == 400, path
        problems = (await response.json())["problems"]
        assert [problem["code"] for problem in problems] == [code] and why in problems[0]["message"], problems
    assert (await client.get("/v2/models/alpha/ready")).status == 200


INFER_BODY = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [PARIS]}]}).encode()


async def in_two_parts(body: bytes, pause: float) -> AsyncIterator[bytes]:
    """``body`` sent in two chunks ``pause`` seconds apart: the server reads it across several turns
    of its loop, as it reads any client that streams its body, so a reload can come in between."""
    yield body[: len(body) // 2]
    await asyncio.sleep(pause)
    yield body[len(body) // 2 :]


async def test_three_reloads_under_six_clients_answer_every_request_200(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    infer = INFER_BODY
    # Six clients: two routes, three paces of sending a body.
    bodies = (("/v2/models/beta/infer", infer), ("/models/beta", PARIS.encode()))
    routes = [(path, body, pause) for path, body in bodies for pause in (0.001, 0.01, 0.05)]
    reloaded = asyncio.Event()

    async def reload() -> None:
        try:
            for top_k in (10, 11, 12):  # a new configuration each time: each a real reload
                config = {"parameters": {"config": json.dumps({"max_top_k": top_k})}}
                response = await client.post("/v2/repository/models/beta/load", json=config, headers=CONTROL)
                assert response.status == 200, await response.text()
        finally:
            reloaded.set()

    async def send(path: str, body: bytes, pause: float) -> list[int]:
        statuses: list[int] = []
        while not reloaded.is_set() and len(statuses) < 2000:  # bounded, whatever the machine's pace
            async with client.post(path, data=in_two_parts(body, pause)) as response:
                statuses.append(response.status)
        return statuses

    reloading = asyncio.create_task(reload())
    sent = await asyncio.gather(*(send(*route) for route in routes))
    await reloading
    assert changes(client, "beta", "reload") == 3
    assert client.app[SERVICE_KEY].models["beta"].settings.max_top_k == 12
    assert all(statuses for statuses in sent), "a client sent nothing while the reloads ran"
    assert {status for statuses in sent for status in statuses} == {200}, [
        status for statuses in sent for status in statuses if status != 200
    ]


@pytest.mark.parametrize(("path", "body"), [("/v2/models/beta/infer", INFER_BODY), ("/models/beta", PARIS.encode())])
async def test_a_request_whose_body_is_still_arriving_holds_its_model_through_a_reload(
    make_client: ClientFactory, model_repository: Path, path: str, body: bytes
) -> None:
    client = await explicit(make_client, model_repository)
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    old = client.app[SERVICE_KEY].models["beta"]
    arrived = asyncio.Event()

    async def slowly() -> AsyncIterator[bytes]:
        yield body[:5]
        await arrived.wait()
        yield body[5:]

    request = asyncio.create_task(client.post(path, data=slowly()))
    await wait_until_active(old, 1)  # held from its headers, before its body
    config = {"parameters": {"config": json.dumps({"max_top_k": 10})}}
    reload = asyncio.create_task(client.post("/v2/repository/models/beta/load", json=config, headers=CONTROL))
    for _ in range(3000):  # until the new model serves (the reload then retires the old one)
        if client.app[SERVICE_KEY].models["beta"] is not old:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert not reload.done() and old.parts is not None  # the old model waits for the request it holds
    arrived.set()
    assert (await request).status == 200
    assert (await reload).status == 200 and old.parts is None


class Siblings:
    """Sibling workers that answer every forwarded request with ``status`` (a load: afresh), and
    remember what they were sent."""

    worker = "0"

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.sent: list[tuple[str, dict[str, str]]] = []

    async def expositions(self) -> list[tuple[str, bytes]]:
        return []

    async def forward(self, path: str, body: bytes, headers: dict[str, str]) -> list[tuple[str, int, bytes]]:
        self.sent.append((path, headers))
        if path.endswith("/unload"):
            return [("1", 200, b"")]
        return [("1", self.status, b'{"fresh": true}' if self.status == 200 else b"")]


async def test_a_public_clients_peer_headers_are_ignored_and_its_load_applied_everywhere(
    make_client: ClientFactory, model_repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = await explicit(make_client, model_repository)
    siblings = client.app[SERVICE_KEY].peers = Siblings()
    caplog.set_level(logging.INFO, "maskserve.models")
    posing = CONTROL | {"X-Maskserve-Peer": "1", "X-Maskserve-Actor": "mallory", "X-Maskserve-Change": "x"}
    response = await client.post("/v2/repository/models/beta/load", headers=posing)
    assert response.status == 200 and await response.read() == b""  # the public answer, not a sibling's
    ((path, headers),) = siblings.sent
    assert path == "/v2/repository/models/beta/load"
    assert headers["X-Maskserve-Actor"].startswith("127.0.0.1 (request ") and headers["X-Maskserve-Change"] != "x"
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model load of 'beta'")]
    assert " by 127.0.0.1 (request " in line and "mallory" not in caplog.text
    # Its index is the whole server's (merged from the siblings'), not this worker's own.
    assert (await client.post("/v2/repository/index", headers={"X-Maskserve-Peer": "1"})).status == 200
    assert siblings.sent[-1][0] == "/v2/repository/index"


async def test_a_load_that_a_sibling_did_not_answer_is_undone_here(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await explicit(make_client, model_repository)
    siblings = client.app[SERVICE_KEY].peers = Siblings(status=0)
    response = await client.post("/v2/repository/models/beta/load", headers=CONTROL)
    answer = await response.json()
    assert response.status == 500 and answer["error_type"] == "model_load_failed"
    assert answer["error"] == (
        "model 'beta' was not loaded on every worker: loaded on worker 0 and undone; worker 1: answered nothing"
    )
    assert "beta" not in client.app[SERVICE_KEY].models
    assert changes(client, "beta", "unload", reason="undo") == 1
    assert len(siblings.sent) == 1  # the sibling never loaded it: nothing to undo there
