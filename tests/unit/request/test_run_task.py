"""What the handlers share (request/run_task.py): one path from every surface's input to a task's answer,
and the timing headers of the slowest row."""

from __future__ import annotations

from typing import Any

import pytest

from maskserve.request.run_task import timing_headers
from maskserve.service.registry import ServedModel
from maskserve.serving.work_queue import Answer
from tests.conftest import ClientFactory

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
