"""Engines loaded one at a time, each on a thread of its own, measured, within a deadline.

A load's thread is its own so that a load that hangs (a hub that never answers, an export that
never ends) holds only that thread: past ``--model-load-timeout`` the load is abandoned and the
next one takes its turn. A thread cannot be stopped, so what the abandoned load reserved counts
against the budget until its thread ends; then what it made is dropped and the memory handed back.
No HTTP, no torch: the engine's loader is handed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import TypeVar

from maskserve.config.model_settings import ModelConfig
from maskserve.config.model_source import ModelLoadError
from maskserve.config.settings import SettingsError
from maskserve.errors import MaskserveError, ModelsMemoryExceeded
from maskserve.model_api import FillMaskModel
from maskserve.service.model_budget import ModelBudget, ModelsDoNotFit
from maskserve.service.model_sources import weights_bytes
from maskserve.serving.memory import rss_bytes

T = TypeVar("T")

# Loads the engine a configuration names (blocking: run on a load's own thread). ``at_start``: a
# model named at start, whose refusal stops the start-up with the engine's own error; otherwise a
# refusal is a ModelLoadFailed with a reason fit for the index.
LoadEngine = Callable[[ModelConfig, bool], FillMaskModel]


class EngineLoader:
    """Runs the loads, one at a time, and measures what each one takes."""

    def __init__(
        self, load_engine: LoadEngine, budget: ModelBudget, hand_back: Callable[[], Coroutine[None, None, None]]
    ) -> None:
        self.load_engine = load_engine
        self.budget = budget
        # Collects and trims what a load dropped; run once an abandoned load's thread ends.
        self.hand_back = hand_back
        # One load at a time, so that loads never compete for the cores with each other as well as
        # with serving; an abandoned load gives its turn up though its thread still runs.
        self._turn = asyncio.Semaphore(1)

    async def run(self, name: str, call: Callable[[], T]) -> T:
        """``call()`` on a thread of its own, in turn with the loads (the runtime's first import)."""
        async with self._turn:
            return await in_own_thread(name, call)

    async def load(self, name: str, config: ModelConfig, at_start: bool, deadline: float) -> tuple[FillMaskModel, int]:
        """The engine and its size, loaded in turn on a thread of its own within ``deadline`` (the
        loop's clock). Past it the load is abandoned: ``name``'s reservation turns into memory on
        its way back, released once the thread ends. Raises TimeoutError then."""
        async with self._turn:
            running = in_own_thread(name, lambda: self._measured(config, at_start))
            try:
                async with asyncio.timeout_at(deadline):
                    return await asyncio.shield(running)
            except TimeoutError:
                ticket = self.budget.releasing_from(self.budget.reserved.pop(name, 0))
                running.add_done_callback(lambda done: self._abandoned(done, ticket))
                raise

    def _abandoned(self, done: asyncio.Future[tuple[FillMaskModel, int]], ticket: int) -> None:
        """An abandoned load's thread has ended: drop what it made, then count its memory back."""
        if not done.cancelled():
            done.exception()  # retrieved, so that asyncio logs nothing: the load already failed
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self.hand_back())
        task.add_done_callback(lambda _: self.budget.released(ticket))

    def _measured(self, config: ModelConfig, at_start: bool) -> tuple[FillMaskModel, int]:
        """On the load's thread: the engine, and its size: the resident bytes its load added, or its
        weights' size on disk if larger (growth alone reads low when the load reuses memory the
        allocator still held from an earlier unload)."""
        before = rss_bytes()
        engine = self.load_engine(config, at_start)
        growth = max(0, rss_bytes() - before)
        # The folder the configuration names; for the default model, the folder the engine found.
        source = config.source or getattr(engine, "source", None)
        return engine, max(growth, weights_bytes(source if isinstance(source, str) else None))


def in_own_thread(name: str, call: Callable[[], T]) -> asyncio.Future[T]:
    """``call()`` on a new daemon thread, its outcome on the running loop: a call that hangs holds
    only its own thread, which the process does not wait for at exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = call(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it in the load
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is leaving
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"maskserve-load-{name}", daemon=True).start()
    return future


def failure_reason(name: str, exc: BaseException, timeout: float) -> str:
    """Why a load did not end serving, for the index and the answer (never an exception's text
    unless it is one of the messages written for clients)."""
    if isinstance(exc, TimeoutError):
        return f"loading {name!r} took longer than --model-load-timeout ({timeout:g}s) and was abandoned"
    if isinstance(exc, MaskserveError):
        return exc.message
    if isinstance(exc, ModelLoadError | SettingsError):  # messages written to name what is at fault
        return str(exc)
    return "an unexpected error; the server log has it"


def start_error(name: str, exc: BaseException, timeout: float) -> BaseException:
    """What stops the start-up for a model named at start that could not be served: the engine's
    own refusal as it is (exit 1 or 2); a budget as the setting at fault (exit 2); a time limit, or
    a folder that cannot load as it stands, as a model that cannot be served (exit 1)."""
    if isinstance(exc, ModelsMemoryExceeded):
        return ModelsDoNotFit(exc.message)
    if isinstance(exc, TimeoutError | MaskserveError):
        return ModelLoadError(failure_reason(name, exc, timeout))
    return exc
