"""Admission's decisions, driven without HTTP; and the wait it advertises, against the real one."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from maskserve.config.settings import Settings
from maskserve.errors import DeadlineExceeded, Overloaded, ShuttingDown
from maskserve.model_api import Query
from maskserve.serving.admission import Admission
from maskserve.serving.batcher import Batcher
from maskserve.serving.costs import BatchReport, Work
from tests.conftest import ClientFactory
from tests.fakes import Costs, EchoModel


def make_batcher(**limits: int) -> Batcher:
    return Batcher(EchoModel(), ThreadPoolExecutor(max_workers=1), Settings(**limits))


def fill(batcher: Batcher, texts: int, tokens: int = 10) -> None:
    """Queue ``texts`` texts past admission, as if admitted earlier (no batch loop takes them)."""
    deadline = asyncio.get_running_loop().time() + 60
    for _ in range(texts):
        batcher.enqueue(Query(input_ids=(4,) * tokens, top_k=1), deadline)


async def test_admits_when_the_queue_has_room_and_time_suffices() -> None:
    admission = Admission(make_batcher(max_queue=4))
    admission.at_door(time_left=1.0)
    assert not admission.refused


async def test_full_queue_is_refused_with_a_computed_retry_after() -> None:
    batcher = make_batcher(max_queue=40, max_batch_size=4)
    batcher.cost.observe(BatchReport(size=4, real_tokens=40, padded_tokens=40, seconds=0.5, failed=0))
    fill(batcher, 40)
    admission = Admission(batcher)
    with pytest.raises(Overloaded) as refused:
        admission.at_door(time_left=1000.0)
    # 40 texts in batches of 4 at 0.5 s a batch of 40 tokens: about 5 s of work ahead.
    assert 4.0 <= refused.value.retry_after <= 6.0
    assert refused.value.headers()["Retry-After"] in {"4", "5", "6"}
    assert admission.refused["queue_full"] == 1


async def test_predicted_wait_beyond_the_deadline_is_refused_at_the_door() -> None:
    batcher = make_batcher(max_queue=100, max_batch_size=4)
    batcher.cost.observe(BatchReport(size=4, real_tokens=40, padded_tokens=40, seconds=0.5, failed=0))
    fill(batcher, 20)
    admission = Admission(batcher)
    admission.at_door(time_left=30.0)  # ~3 s of work ahead: fine with 30 s
    with pytest.raises(Overloaded) as refused:
        admission.at_door(time_left=1.0)
    assert "deadline" in refused.value.message
    assert admission.refused["predicted_timeout"] == 1


async def test_unmeasured_cost_never_refuses_on_a_guess() -> None:
    batcher = make_batcher(max_queue=100)
    fill(batcher, 50)
    admission = Admission(batcher)
    admission.at_door(time_left=0.001)  # raises if refused
    admission.admit(Work.of([Query(input_ids=(4,) * 10, top_k=1)]), time_left=0.001, request_timeout=30.0)
    assert batcher.predicted_wait() == 0.0
    assert not admission.refused


async def test_a_request_is_admitted_whole_or_refused_whole() -> None:
    batcher = make_batcher(max_queue=3)
    fill(batcher, 2)
    admission = Admission(batcher)
    two = Work.of([Query(input_ids=(4,) * 10, top_k=1)] * 2)
    with pytest.raises(Overloaded) as refused:  # one text would fit; the request's two do not
        admission.admit(two, time_left=10.0, request_timeout=30.0)
    assert refused.value.retry_after >= 1
    assert admission.refused["queue_full"] == 1
    assert batcher.depth == 2


async def test_closed_batcher_is_refused_as_shutting_down() -> None:
    batcher = make_batcher()
    batcher.close()
    admission = Admission(batcher)
    with pytest.raises(ShuttingDown):
        admission.at_door(time_left=10.0)
    assert admission.refused["shutting_down"] == 1


async def test_request_already_past_its_deadline_at_the_door_answers_504_not_503() -> None:
    admission = Admission(make_batcher())
    with pytest.raises(DeadlineExceeded):
        admission.at_door(time_left=-0.0)
    assert not admission.refused


@pytest.mark.serial  # compares a predicted wait with the real one: a test beside it would move the real one
async def test_the_advertised_wait_stays_within_twice_the_real_one_on_a_mixed_flood(
    make_client: ClientFactory,
) -> None:
    # A model that costs what a real one does, in its two phases: a pass, its padded tokens, and
    # decoding every prediction's copy of its text.
    model = EchoModel(Costs(per_pass=0.01, per_padded_token=2e-5, per_prediction_token=2e-6))
    client = await make_client(engine=model, warmup=True, max_batch_size=8)
    long_text = {"inputs": "w " * 300 + "[MASK]", "parameters": {"top_k": 20}}
    short_text = {"inputs": "a short one [MASK] .", "parameters": {"top_k": 5}}
    stop = asyncio.Event()

    async def flood(index: int) -> None:
        while not stop.is_set():
            response = await client.post("/", json=long_text if index % 3 == 0 else short_text)
            assert response.status in (200, 503), await response.text()
            await response.read()

    flooders = [asyncio.create_task(flood(i)) for i in range(24)]
    ratios: list[float] = []
    try:
        await asyncio.sleep(0.5)
        for _ in range(40):
            # What the door and Retry-After go by: the predicted wait for one more text now...
            predicted = (await (await client.get("/readyz")).json())["predicted_wait_s"]
            started = asyncio.get_running_loop().time()
            response = await client.post("/", json=short_text)
            # ...against how long one more text really took.
            if response.status == 200:
                ratios.append((asyncio.get_running_loop().time() - started) / predicted)
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*flooders)
    ratios.sort()
    assert len(ratios) >= 30, ratios
    # Within twice either way for nine in ten probes; the middle one close to even.
    assert ratios[len(ratios) // 20] >= 0.5 and ratios[-len(ratios) // 20 - 1] <= 2.0, ratios
    assert 0.67 <= ratios[len(ratios) // 2] <= 1.5, ratios
