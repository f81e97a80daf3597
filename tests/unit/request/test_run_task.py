"""What the handlers share (request/run_task.py): one path from every surface's input to a task's answer,
and the timing headers of the slowest row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from maskserve.config.settings import Settings
from maskserve.request.keys import SERVICE_KEY
from maskserve.request.run_task import served_model, timing_headers
from maskserve.service.served_model import ServedModel
from maskserve.serving.work_queue import Answer
from tests.conftest import CONTROL_KEY, ClientFactory

PARIS = "Paris is the [MASK] of France."
OIP_BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [PARIS]}]}
# Every surface that queues work for the model, and the task it runs.
SURFACES: list[tuple[str, dict[str, Any], str]] = [
    ("/", {"data": PARIS}, "FillMask"),
    ("/models/maskserve", {"json": {"inputs": [PARIS, PARIS]}}, "FillMask"),
    ("/score", {"json": {"inputs": "Paris is nice."}}, "Score"),
    ("/models/maskserve/score", {"data": "Paris is nice."}, "Score"),
    ("/v2/models/maskserve/infer", {"json": OIP_BODY}, "FillMask"),
    ("/demo", {"data": {"text": PARIS, "top_k": "2"}}, "FillMask"),
    ("/demo/score", {"data": {"sentences": "Paris is nice.\nA cat sat."}}, "Score"),
]


async def test_every_surface_runs_its_task_through_the_one_path(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await make_client()
    planned: list[str] = []
    folded: list[str] = []
    plan, fold = ServedModel.plan, ServedModel.fold

    async def plan_spy(self: ServedModel, task: Any, *args: Any) -> Any:
        planned.append(type(task).__name__)
        return await plan(self, task, *args)

    async def fold_spy(self: ServedModel, task: Any, *args: Any) -> Any:
        folded.append(type(task).__name__)
        return await fold(self, task, *args)

    monkeypatch.setattr(ServedModel, "plan", plan_spy)
    monkeypatch.setattr(ServedModel, "fold", fold_spy)
    for path, body, task in SURFACES:
        response = await client.post(path, **body)
        assert response.status == 200, (path, await response.text())
        assert planned[-1] == folded[-1] == task, path
        assert int(response.headers["X-Batch-Size"]) >= 1
    assert len(planned) == len(folded) == len(SURFACES)


def test_the_timing_headers_are_the_slowest_rows_figures() -> None:
    rows = [Answer([], 0.002, 0.030, 4), Answer([], 0.010, 0.020, 2), Answer([], 0.001, 0.001, 8)]
    assert timing_headers(rows) == {"X-Queue-Time-Ms": "10.00", "X-Inference-Time-Ms": "30.00", "X-Batch-Size": "8"}


# What the stage below does to a request's model after resolving it, as its header asks.
CHANGE_HEADER = "X-Test-Change-Model"


def resolve_then_change(settings: Settings) -> Middleware:
    """A stage before the door that resolves the request's model, then unloads or reloads it (as
    its header asks) before the door holds it: the race the door's hold closes, made certain."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        change = request.headers.get(CHANGE_HEADER)
        if change:
            served = served_model(request)
            control = request.app[SERVICE_KEY].control
            assert control is not None
            if change == "unload":
                await control.unload(served.name)
            else:
                await control.load(served.name, {"max_top_k": 10})
            assert served.released
        return await handler(request)

    return middleware


resolve_then_change.reads_body = False  # type: ignore[attr-defined]
RACING = f"default,+{__name__}:resolve_then_change"


async def racing_client(make_client: ClientFactory, model_repository: Path) -> Any:
    """A server whose racing stage changes beta between a request's resolving it and holding it."""
    client = await make_client(
        model_repository=str(model_repository),
        model_control_mode="explicit",
        control_key=CONTROL_KEY,
        middleware=RACING,
    )
    control = {"Authorization": f"Bearer {CONTROL_KEY}"}
    assert (await client.post("/v2/repository/models/beta/load", headers=control)).status == 200
    return client


@pytest.mark.parametrize("path", ["/models/beta", "/v2/models/beta/infer"])
async def test_a_model_released_before_its_request_is_held_answers_503_with_retry_after(
    make_client: ClientFactory, model_repository: Path, path: str
) -> None:
    client = await racing_client(make_client, model_repository)
    body = {"json": OIP_BODY} if path.startswith("/v2") else {"data": PARIS}
    response = await client.post(path, headers={CHANGE_HEADER: "unload"}, **body)
    assert response.status == 503 and int(response.headers["Retry-After"]) >= 1
    answer = await response.json()
    assert answer["error_type"] == "model_unavailable" and "beta" in answer["error"]
    assert (await client.post(path, **body)).status == 404  # and now it is simply not loaded


@pytest.mark.parametrize("path", ["/models/beta", "/v2/models/beta/infer"])
async def test_a_model_swapped_by_a_reload_before_its_request_is_held_serves_it_with_the_new_model(
    make_client: ClientFactory, model_repository: Path, path: str
) -> None:
    client = await racing_client(make_client, model_repository)
    body = {"json": OIP_BODY} if path.startswith("/v2") else {"data": PARIS}
    response = await client.post(path, headers={CHANGE_HEADER: "reload"}, **body)
    assert response.status == 200, await response.text()
    assert client.app[SERVICE_KEY].models["beta"].settings.max_top_k == 10
    if not path.startswith("/v2"):
        assert len(await response.json()) == 5
    else:
        assert len(json.loads((await response.json())["outputs"][0]["data"][0])) == 5
