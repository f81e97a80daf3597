"""This worker's part of a model repository change (request/worker_loads.py): what it remembers of
the loads it applied, an undo that touches only the change it names, and a failed reload's error
saying that the old model serves."""

from __future__ import annotations

from typing import Any

import pytest

from maskserve.errors import MaskserveError, ModelLoadFailed, RateLimited
from maskserve.request.worker_loads import load_here, reworded, serving_config, undo_here, unload_here
from maskserve.service.registry import FillMaskService
from tests.unit.request.conftest import FakeServed


def control(service: FillMaskService) -> Any:
    return service.control


async def test_a_load_remembers_its_config_while_its_model_serves(service: FillMaskService) -> None:
    assert await load_here(service, control(service), "beta", {"max_top_k": 3}, change="c1", actor="t") is True
    assert serving_config(service, control(service), "beta") == {"max_top_k": 3}
    assert await load_here(service, control(service), "beta", None, change="c2", actor="t") is False  # a reload
    assert serving_config(service, control(service), "beta") is None
    await load_here(service, control(service), "beta", {"max_top_k": 4}, change="c3", actor="t")
    service.models["beta"] = FakeServed()  # type: ignore[assignment]  # loaded again on demand
    assert serving_config(service, control(service), "beta") is None
    await unload_here(control(service), "beta", actor="t")
    assert serving_config(service, control(service), "beta") is None


async def test_an_undo_unloads_only_what_its_change_loaded_afresh(service: FillMaskService) -> None:
    await load_here(service, control(service), "beta", None, change="c1", actor="t")
    assert await undo_here(service, control(service), "beta", "other") is False
    assert "beta" in service.models
    assert await undo_here(service, control(service), "beta", "c1") is True
    assert "beta" not in service.models
    # A reload is never undone: the old model is gone where it succeeded.
    service.models["gamma"] = FakeServed()  # type: ignore[assignment]
    await load_here(service, control(service), "gamma", None, change="c2", actor="t")
    assert await undo_here(service, control(service), "gamma", "c2") is False and "gamma" in service.models


async def test_a_failed_reload_says_the_old_model_still_serves(service: FillMaskService) -> None:
    old = service.models["beta"] = FakeServed()  # type: ignore[assignment]
    control(service).failing["beta"] = ModelLoadFailed("loading 'beta' failed: no weights")
    kept = r"^loading 'beta' failed: no weights \(the old model still serves there\)$"
    with pytest.raises(ModelLoadFailed, match=kept):
        await load_here(service, control(service), "beta", None, change="c1", actor="t")
    assert service.models["beta"] is old
    control(service).failing["gamma"] = ModelLoadFailed("loading 'gamma' failed: no weights")
    with pytest.raises(ModelLoadFailed, match=r"^loading 'gamma' failed: no weights$"):  # nothing served before
        await load_here(service, control(service), "gamma", None, change="c1", actor="t")


class Picky(MaskserveError):
    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)


def test_an_error_reworded_keeps_its_class_or_becomes_a_failed_load() -> None:
    assert type(reworded(Picky("x", 1), "y")) is ModelLoadFailed  # it needs more than a message
    limited = reworded(RateLimited("slow down", 1.0), "later")
    assert type(limited) is RateLimited and limited.message == "later"
    again = reworded(MaskserveError("a"), "b")
    assert type(again) is MaskserveError and again.message == "b"
    assert type(reworded(None, "c")) is ModelLoadFailed
