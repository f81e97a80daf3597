"""service/model_loader.py: loads in turn on threads of their own, measured; a load past its
deadline is abandoned, its memory counted until its thread ends, and the next load goes on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from maskserve.config.model_settings import ModelConfig
from maskserve.config.settings import Settings
from maskserve.model_api import FillMaskModel
from maskserve.service.model_budget import MIB, ModelBudget
from maskserve.service.model_loader import EngineLoader, in_own_thread
from tests.fakes import EchoModel


def config(name: str, source: str | None = None) -> ModelConfig:
    return ModelConfig(name, source, Settings())


async def no_hand_back() -> None:
    return None


async def test_a_load_runs_on_a_thread_of_its_own_and_measures_at_least_its_weights(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (2 * MIB))
    threads: list[str] = []

    def load(config: ModelConfig, at_start: bool) -> FillMaskModel:
        threads.append(threading.current_thread().name)
        return EchoModel()

    loader = EngineLoader(load, ModelBudget(None), no_hand_back)
    deadline = asyncio.get_running_loop().time() + 30
    engine, size = await loader.load("m", config("m", str(tmp_path)), False, deadline)
    assert isinstance(engine, EchoModel) and size >= 2 * MIB
    assert threads == ["maskserve-load-m"]


async def test_a_refusal_is_raised_in_the_load() -> None:
    def load(config: ModelConfig, at_start: bool) -> FillMaskModel:
        raise ValueError("no such model")

    loader = EngineLoader(load, ModelBudget(None), no_hand_back)
    with pytest.raises(ValueError, match="no such model"):
        await loader.load("m", config("m"), False, asyncio.get_running_loop().time() + 30)


async def test_a_load_past_its_deadline_is_abandoned_and_the_next_load_goes_on() -> None:
    release = threading.Event()
    handed_back = asyncio.Event()

    def load(config: ModelConfig, at_start: bool) -> FillMaskModel:
        if config.name == "hangs":
            release.wait(30)
        return EchoModel()

    async def hand_back() -> None:
        handed_back.set()

    budget = ModelBudget(1000 * MIB)
    loader = EngineLoader(load, budget, hand_back)
    budget.reserved["hangs"] = 300 * MIB
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await loader.load("hangs", config("hangs"), False, loop.time() + 0.2)
    # Its reservation is memory on its way back while its thread still runs.
    assert "hangs" not in budget.reserved and budget.held() == 300 * MIB
    engine, _ = await loader.load("next", config("next"), False, loop.time() + 30)  # not held behind it
    assert isinstance(engine, EchoModel)
    release.set()
    await asyncio.wait_for(handed_back.wait(), 30)
    for _ in range(100):  # the ticket is released once the hand-back has run
        if budget.held() == 0:
            break
        await asyncio.sleep(0.01)
    assert budget.held() == 0


async def test_a_call_on_its_own_thread_hands_its_outcome_to_the_loop() -> None:
    assert await in_own_thread("x", lambda: 42) == 42

    def fails() -> int:
        raise KeyError("gone")

    with pytest.raises(KeyError):
        await in_own_thread("y", fails)
