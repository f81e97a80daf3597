"""Fault injection through HTTP: a poisoned input, a model that fails everything, a forward pass
that hangs, a model that cannot load. The server answers cleanly, stays up, and recovers."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from maskserve.engine import FillMaskEngine
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, wait_for_depth, wait_until_entered
from tests.live_server import start_maskserve

LEAKS = ("Traceback", "RuntimeError", "injected fault", 'File "', ".py")


def assert_clean_500(body: dict[str, str]) -> None:
    assert body["error_type"] == "inference_failed"
    assert set(body) == {"error", "error_type", "request_id"}
    for leak in LEAKS:
        assert leak not in body["error"]


async def test_a_poisoned_input_fails_alone_and_its_batch_neighbours_are_answered(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model)
    poisoned = "the [MASK] is poisoned."
    model.poisoned.add(bert_engine.encode(poisoned))
    texts = [f"text {i} is a [MASK]." for i in range(7)]
    # Hold the model so all eight queue together and share a batch with the poisoned one.
    model.hold()
    first = asyncio.create_task(client.post("/", data="warm [MASK]."))
    await wait_until_entered(model)
    requests = [asyncio.create_task(client.post("/", data=text)) for text in [*texts[:3], poisoned, *texts[3:]]]
    await wait_for_depth(default_parts(client).batcher, 8)
    model.release()
    responses = await asyncio.gather(first, *requests)
    statuses = [r.status for r in responses]
    assert statuses == [200] * 4 + [500] + [200] * 4
    assert_clean_500(await responses[4].json())
    assert any(len(batch) == 8 for batch in model.batches), "the eight never shared a batch"


async def test_a_model_failing_every_input_answers_500_to_all_and_recovers_when_the_fault_stops(
    make_client: ClientFactory, bert_engine: FillMaskEngine
) -> None:
    model = ControlledModel(bert_engine)
    client = await make_client(engine=model)
    model.fail_all = True
    responses = await asyncio.gather(*(client.post("/", data=f"fault {i} [MASK].") for i in range(12)))
    assert [r.status for r in responses] == [500] * 12
    for response in responses:
        assert_clean_500(await response.json())
    # Still up and honest: alive (no stuck pass), ready (nothing queued).
    assert (await client.get("/livez")).status == 200
    assert (await client.get("/readyz")).status == 200
    model.fail_all = False
    responses = await asyncio.gather(*(client.post("/", data=f"fine {i} [MASK].") for i in range(12)))
    assert [r.status for r in responses] == [200] * 12


async def test_a_hung_forward_pass_answers_504_fails_the_probes_and_recovers_when_it_returns(
    make_client: ClientFactory,
) -> None:
    model = ControlledModel()
    client = await make_client(engine=model, stall_timeout=0.3, max_queue=8)
    model.hold()
    try:
        hung = asyncio.create_task(client.post("/", data="hung [MASK]", headers={"X-Request-Timeout": "1"}))
        await wait_until_entered(model)
        # Requests behind the hung pass get their 504 at their deadline, while it still hangs.
        waiting = await asyncio.gather(
            *(client.post("/", data=f"w{i} [MASK]", headers={"X-Request-Timeout": "0.3"}) for i in range(4))
        )
        assert [r.status for r in waiting] == [504] * 4
        assert (await waiting[0].json())["error_type"] == "timeout"
        assert (await hung).status == 504
        await asyncio.sleep(0.3)  # past the stall budget
        live, ready = await client.get("/livez"), await client.get("/readyz")
        assert (live.status, ready.status) == (503, 503)
        assert [p["code"] for p in (await live.json())["problems"]] == ["stalled"]
    finally:
        model.release()
    # The pass returned: the server heals by itself, no restart needed.
    for _ in range(200):
        if (await client.get("/livez")).status == 200:
            break
        await asyncio.sleep(0.02)
    assert (await client.get("/livez")).status == 200
    assert (await client.get("/readyz")).status == 200
    assert (await client.post("/", data="after [MASK]")).status == 200


def test_a_model_that_cannot_load_exits_non_zero_clearly_and_never_listens(tmp_path: Path) -> None:
    server = start_maskserve("--model", "/nonexistent/model", log_path=tmp_path / "server.log")
    try:
        exit_code = server.wait(120)
    finally:
        server.kill()
    assert exit_code == 1
    output = server.log()
    assert "/nonexistent/model" in output and "cannot start" in output
    assert "Traceback" not in output
    port = server.port
    # Nothing half-started: the port was never bound.
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
