"""Loads, unloads and the memory budget (service/model_control.py), driven directly on a running
app: which loads are one, what waits for what, what a model is charged, and when it is idle."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from maskserve.errors import ModelNotLoaded, NotFound
from maskserve.request.keys import SERVICE_KEY
from maskserve.service.model_control import ModelControl
from tests.conftest import CONTROL_KEY, ClientFactory


async def control_of(make_client: ClientFactory, repository: Path, mode: str = "explicit") -> ModelControl:
    client = await make_client(model_repository=str(repository), model_control_mode=mode, control_key=CONTROL_KEY)
    control = client.app[SERVICE_KEY].control
    assert control is not None
    return control


def loads(control: ModelControl, name: str, action: str = "load") -> float:
    value = control.table.metrics.registry.get_sample_value(
        "maskserve_model_changes_total", {"model": name, "action": action, "reason": "request", "result": "ok"}
    )
    return value or 0.0


async def test_loads_asking_the_same_are_one_and_another_config_reloads_after(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository)
    await asyncio.gather(control.load("beta"), control.load("beta"), control.load("beta", {"max_top_k": 3}))
    assert loads(control, "beta") == 1 and loads(control, "beta", "reload") == 1
    assert control.table.models["beta"].settings.max_top_k == 3


async def test_a_load_asked_while_the_model_unloads_waits_and_loads_it_again(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository)
    await control.load("beta")
    unloading = asyncio.create_task(control.unload("beta"))
    await asyncio.sleep(0)
    assert control.records["beta"].state == "UNLOADING"
    await control.load("beta")
    assert unloading.done() and control.records["beta"].state == "READY" and "beta" in control.table.models


async def test_a_model_named_at_start_is_charged_its_weights_not_the_runtimes_start(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository)
    weights = sum(p.stat().st_size for p in (model_repository / "alpha").glob("*.safetensors"))
    assert control.records["alpha"].memory_bytes == weights


async def test_unknown_and_unloaded_models_are_told_apart(make_client: ClientFactory, model_repository: Path) -> None:
    control = await control_of(make_client, model_repository)
    with pytest.raises(NotFound, match="no model named 'nosuch' in the model repository; it holds 'alpha'"):
        await control.load("nosuch")
    with pytest.raises(ModelNotLoaded, match="'gamma' is not loaded"):
        await control.ensure("gamma", asyncio.get_running_loop().time() + 5)
    await control.unload("gamma")  # not loaded: nothing to do, as the protocol answers


async def test_on_demand_loads_once_for_many_waiting_requests(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository, mode="on-demand")
    deadline = asyncio.get_running_loop().time() + 30
    served = await asyncio.gather(*(control.ensure("gamma", deadline) for _ in range(5)))
    assert len({id(model) for model in served}) == 1
    on_demand = control.table.metrics.registry.get_sample_value(
        "maskserve_model_changes_total", {"model": "gamma", "action": "load", "reason": "on_demand", "result": "ok"}
    )
    assert on_demand == 1
