"""Loads, unloads and the memory budget (service/model_control.py), driven directly on a running
app: which loads are one, what waits for what, what a model is charged, and when it is idle."""

from __future__ import annotations

import asyncio
import gc
import shutil
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from maskserve.config.bounds import settings_from
from maskserve.config.model_settings import ModelConfig
from maskserve.config.model_source import ModelLoadError
from maskserve.errors import ModelLoadFailed, ModelNotLoadable, ModelNotLoaded, ModelsMemoryExceeded, NotFound
from maskserve.http.app import create_app
from maskserve.model_api import FillMaskModel
from maskserve.request.keys import SERVICE_KEY
from maskserve.service.model_budget import MIB, ModelsDoNotFit
from maskserve.service.model_control import ModelControl
from maskserve.service.model_sources import weights_bytes
from tests.conftest import CONTROL_KEY, ClientFactory


async def client_of(make_client: ClientFactory, repository: Path, mode: str = "explicit", **settings: Any) -> Any:
    """A client of a server of ``repository`` under ``mode`` control, with ``settings``."""
    return await make_client(
        model_repository=str(repository), model_control_mode=mode, control_key=CONTROL_KEY, **settings
    )


async def control_of(make_client: ClientFactory, repository: Path, mode: str = "explicit") -> ModelControl:
    control = (await client_of(make_client, repository, mode)).app[SERVICE_KEY].control
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
    assert state(control, "beta") == "UNLOADING"
    await control.load("beta")
    assert unloading.done() and control.records["beta"].state == "READY" and "beta" in control.table.models


async def test_a_model_named_at_start_is_charged_what_its_load_measured_at_least_its_weights(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository)
    weights = sum(p.stat().st_size for p in (model_repository / "alpha").glob("*.safetensors"))
    assert control.records["alpha"].memory_bytes == control.budget.charged["alpha"] >= weights


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


class SlowLoads:
    """Wraps the control's engine loader: a load of a model named here waits for its event."""

    def __init__(self, control: ModelControl, *names: str) -> None:
        self.gates = {name: threading.Event() for name in names}
        self.inner = control.loader.load_engine
        control.loader.load_engine = self.load

    def load(self, config: ModelConfig, at_start: bool) -> FillMaskModel:
        gate = self.gates.get(config.name)
        if gate is not None:
            gate.wait(60)
        return self.inner(config, at_start)

    def release(self) -> None:
        for gate in self.gates.values():
            gate.set()


def state(control: ModelControl, name: str) -> str | None:
    record = control.records.get(name)
    return record.state if record is not None else None


async def until(check: Callable[[], bool]) -> None:
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_an_unload_never_waits_behind_another_models_load(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository)
    await control.load("beta")
    slow = SlowLoads(control, "gamma")
    loading = asyncio.create_task(control.load("gamma"))
    await until(lambda: state(control, "gamma") == "LOADING")
    await asyncio.wait_for(control.unload("beta"), 30)
    assert control.records["beta"].state == "UNAVAILABLE" and not loading.done()
    slow.release()
    await loading
    assert "gamma" in control.table.models


async def test_an_idle_models_unload_never_waits_for_the_inference_thread(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await client_of(make_client, model_repository)
    control = client.app[SERVICE_KEY].control
    assert control is not None
    await control.load("beta")
    assert (await client.post("/models/beta", data="the [MASK] sat.")).status == 200  # it ran a pass
    engine = weakref.ref(control.table.models["beta"].loaded.model)
    # Another model's long pass (a warm-up, a batch) holds the inference thread meanwhile.
    held = threading.Event()
    control.scheduler.executor.submit(held.wait, 60)
    try:
        await asyncio.wait_for(control.unload("beta"), 30)
        assert control.records["beta"].state == "UNAVAILABLE"
        gc.collect()
        assert engine() is None  # nothing on the inference thread kept it either
    finally:
        held.set()


async def test_a_load_past_its_timeout_is_abandoned_and_the_next_load_of_it_starts(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await client_of(make_client, model_repository, "explicit", model_load_timeout=0.5)
    control = client.app[SERVICE_KEY].control
    assert control is not None
    slow = SlowLoads(control, "gamma")
    with pytest.raises(ModelLoadFailed, match=r"longer than --model-load-timeout \(0.5s\) and was abandoned") as failed:
        await control.load("gamma")
    assert failed.value.status == 500
    assert control.records["gamma"].state == "UNAVAILABLE" and "abandoned" in control.records["gamma"].reason
    del slow.gates["gamma"]  # the next load of it goes straight through
    await control.load("gamma")
    assert "gamma" in control.table.models
    slow.release()


async def test_an_on_demand_request_never_replaces_an_explicit_loads_config(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository, mode="on-demand")
    slow = SlowLoads(control, "gamma")
    explicit = asyncio.create_task(control.load("gamma", {"max_top_k": 3}))
    await until(lambda: state(control, "gamma") == "LOADING")
    on_demand = asyncio.create_task(control.ensure("gamma", asyncio.get_running_loop().time() + 60))
    await asyncio.sleep(0.05)
    slow.release()
    await explicit
    served = await on_demand
    assert served.settings.max_top_k == 3 and control.table.models["gamma"] is served
    assert loads(control, "gamma", "reload") == 0


async def test_a_model_being_unloaded_counts_against_the_budget_until_its_memory_is_back(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository)
    await control.load("beta")
    size = control.budget.charged["beta"]
    held = threading.Event()
    control.scheduler.executor.submit(held.wait, 30)  # beta's unload drains behind this pass
    served = control.table.models["beta"]
    with served.in_use():
        unloading = asyncio.create_task(control.unload("beta"))
        await until(lambda: state(control, "beta") == "UNLOADING")
        assert "beta" not in control.budget.charged and control.budget.held() >= size
    held.set()
    await unloading
    assert control.budget.releasing == {}


async def test_a_load_that_measures_more_than_it_reserved_evicts_idle_models_or_is_not_kept(
    make_client: ClientFactory, model_repository: Path
) -> None:
    control = await control_of(make_client, model_repository)
    await control.load("beta")
    control.budget.charged["beta"] = 100 * MIB  # as if beta had measured that much
    control.budget.budget_bytes = control.budget.held() + 50 * MIB
    extra = {"gamma": 60 * MIB}
    measured = control.loader._measured

    def more(config: ModelConfig, at_start: bool) -> tuple[FillMaskModel, int]:
        engine, size = measured(config, at_start)
        return engine, size + extra.get(config.name, 0)

    control.loader._measured = more  # type: ignore[method-assign]
    await control.load("gamma")  # it fitted its estimate, not its measure: beta, idle, goes
    assert control.records["beta"].reason == "evicted to make room (--models-memory)"
    assert control.budget.held() <= control.budget.budget_bytes
    extra["beta"] = 10 * 1024 * MIB  # more than even every idle model would make room for
    with pytest.raises(ModelsMemoryExceeded, match=r"'beta' measured .* it was not kept"):
        await control.load("beta")
    assert "beta" not in control.table.models and "beta" not in control.budget.reserved
    assert "gamma" in control.table.models


async def test_on_demand_loads_that_would_evict_a_model_younger_than_the_minimum_are_paced(
    make_client: ClientFactory, model_repository: Path
) -> None:
    client = await client_of(make_client, model_repository, "on-demand", model_min_residency=60)
    control = client.app[SERVICE_KEY].control
    assert control is not None
    # Every load measures its weights' size, so that what a load evicts is known in advance.
    control.loader._measured = lambda config, at_start: (  # type: ignore[method-assign]
        control.loader.load_engine(config, at_start),
        weights_bytes(config.source),
    )
    deadline = asyncio.get_running_loop().time() + 60
    await control.ensure("beta", deadline)
    control.budget.budget_bytes = control.budget.held() + 1  # gamma fits only if one goes
    paced = await client.post("/models/gamma", data="Paris is the [MASK] of France.")
    body = await paced.json()
    assert paced.status == 503 and body["error_type"] == "loads_paced" and int(paced.headers["Retry-After"]) >= 50
    assert {"alpha", "beta"} <= set(control.table.models) and "gamma" not in control.table.models
    # An explicit load is not held by the pacing: the least recently used idle model goes.
    await control.load("gamma")
    assert "gamma" in control.table.models and len(control.table.models) == 2
    assert control.budget.held() <= control.budget.budget_bytes


async def test_a_half_copied_folder_is_listed_and_refused_and_a_deleted_one_is_unknown(
    make_client: ClientFactory, model_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(model_repository, repository)
    control = await control_of(make_client, repository, mode="on-demand")
    await control.load("gamma")
    await control.unload("gamma")
    shutil.rmtree(repository / "gamma")
    (repository / "delta").mkdir()
    shutil.copy(repository / "beta" / "config.json", repository / "delta" / "config.json")
    entries = {entry.name: entry for entry in control.index()}
    assert "gamma" not in entries and entries["delta"].reason.startswith("not loadable: its folder lacks weights")
    with pytest.raises(ModelNotLoadable, match="'delta' cannot be loaded: its folder lacks weights") as refused:
        await control.load("delta")
    assert refused.value.status == 409
    for _ in range(2):
        with pytest.raises(NotFound, match="no model named 'gamma'"):
            await control.load("gamma")
        with pytest.raises(NotFound):
            await control.ensure("gamma", asyncio.get_running_loop().time() + 5)
    assert not [record for record in caplog.records if record.exc_info]


async def start_error(engine: FillMaskModel, **settings: Any) -> BaseException:
    """What the app's start-up raises with these settings (the models named at start are loaded
    there, through the model control); it must raise."""
    runner = web.AppRunner(create_app(settings_from({"warmup": False, **settings}), engine=engine))
    try:
        await runner.setup()
    except BaseException as exc:  # noqa: BLE001 - the start-up's error is what the test reads
        return exc
    finally:
        await runner.cleanup()
    raise AssertionError("the start-up did not fail")


async def test_a_model_named_at_start_whose_folder_is_not_whole_stops_the_start_naming_what_it_lacks(
    bert_engine: FillMaskModel, model_repository: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(model_repository / "beta", repository / "delta")
    (repository / "delta" / "model.safetensors").unlink()
    error = await start_error(bert_engine, model_repository=str(repository), model=("delta",))
    assert isinstance(error, ModelLoadError), error
    assert "'delta' cannot be loaded: its folder lacks weights" in str(error)


async def test_a_model_named_at_start_that_does_not_fit_stops_the_start_naming_it(
    bert_engine: FillMaskModel, model_repository: Path
) -> None:
    error = await start_error(
        bert_engine, model_repository=str(model_repository), model=("alpha",), models_memory="1KiB"
    )
    assert isinstance(error, ModelsDoNotFit), error
    assert str(error).startswith("--models-memory: the models named at start") and "'alpha'" in str(error)
