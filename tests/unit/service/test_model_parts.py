"""A model started and retired (service/model_parts.py): reachable only once warm and observed;
retired only once what it accepted is answered, and then nothing holds its engine."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from pathlib import Path

from maskserve.request.keys import SERVICE_KEY
from maskserve.service.model_parts import retire_model
from tests.conftest import CONTROL_KEY, ClientFactory

CONTROL = {"Authorization": f"Bearer {CONTROL_KEY}"}


async def test_a_started_model_is_warm_and_observed_before_it_is_reachable(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await make_client(
        model_repository=str(model_repository), model_control_mode="explicit", control_key=CONTROL_KEY, warmup=True
    )
    service = client.app[SERVICE_KEY]
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    parts = service.models["beta"].loaded
    assert parts.batcher.forecast.calibrated_longest_s > 0  # warmed up: its costs are measured
    assert parts.batcher in service.scheduler.lanes
    info = [
        line for line in (await (await client.get("/metrics")).text()).splitlines() if "maskserve_model_info{" in line
    ]
    assert any('model="beta"' in line for line in info)


async def test_retiring_waits_for_what_it_accepted_then_nothing_holds_its_engine(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await make_client(
        model_repository=str(model_repository), model_control_mode="explicit", control_key=CONTROL_KEY
    )
    service = client.app[SERVICE_KEY]
    assert (await client.post("/v2/repository/models/beta/load", headers=CONTROL)).status == 200
    served = service.models["beta"]
    engine = weakref.ref(served.loaded.model)
    held = threading.Event()
    service.scheduler.executor.submit(held.wait, 30)
    accepted = asyncio.create_task(client.post("/models/beta", data="the [MASK] sat."))
    while not served.active:
        await asyncio.sleep(0.01)
    del service.models["beta"]  # out of the routes, as an unload takes it
    retiring = asyncio.create_task(retire_model(service.table, served, service.scheduler))
    await asyncio.sleep(0.1)
    assert not retiring.done() and served.parts is not None
    held.set()
    assert (await accepted).status == 200
    await retiring
    assert served.parts is None and served.released
    gc.collect()
    # Not the scheduler's loop, the metrics, the lanes nor the listeners: the engine is gone.
    assert engine() is None
