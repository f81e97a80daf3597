"""Models loaded and unloaded: the model repository extension's engine room, and the one path every
model takes into service, those named at start included.

One :class:`ModelControl` per server (per worker) knows every model it may serve (those named at
start, and every model of ``--model-repository``), each in one of the protocol's states:

    UNAVAILABLE ──load──▶ LOADING ──ready──▶ READY ──unload──▶ UNLOADING ──released──▶ UNAVAILABLE
                              └──failed──▶ UNAVAILABLE (reason)     (a reload stays READY throughout)

**One load path.** A model named at start and one loaded on request take the same steps: its files
checked, room made within the budget, its weights loaded on a thread of its own with the resident
growth measured, the measure checked against the budget, its warm-up on the inference thread, then
its entry in the table. Start-up only differs in what a failure means: the process does not start.

**Loading never stalls serving, nor unloading.** Loads run one at a time on a thread of their own,
never on the event loop or the inference thread; a load that outlasts ``--model-load-timeout`` is
abandoned (its thread cannot be stopped, so its memory counts until the thread ends and is handed
back then), and the next load starts. Memory is handed back on a trimming thread of its own, so an
unload never waits behind another model's load.

**Unloading drains.** The model leaves the table at once; every request it had accepted is
answered; then its lane, its series and its engine are released and its memory handed back.

No HTTP and no torch: the engine's loader is handed in by the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from maskserve.config.model_repository import ModelRepository
from maskserve.config.model_settings import ModelConfig
from maskserve.errors import (
    DeadlineExceeded,
    LoadsPaced,
    MaskserveError,
    ModelLoadFailed,
    ModelNotLoaded,
    ModelsMemoryExceeded,
    ModelUnavailable,
    NotFound,
)
from maskserve.observability.live_state import ModelsState
from maskserve.service.model_budget import MIB, Candidate, ModelBudget, ModelsDoNotFit
from maskserve.service.model_catalog import IndexEntry, ModelCatalog, ModelRecord
from maskserve.service.model_loader import EngineLoader, LoadEngine, failure_reason, start_error
from maskserve.service.model_parts import retire_model, start_model
from maskserve.service.model_sources import check_files, config_for_load, weights_bytes
from maskserve.service.served_model import ModelTable, ServedModel
from maskserve.serving.memory import release_freed_memory
from maskserve.serving.scheduler import Scheduler

log = logging.getLogger("maskserve.models")


class ModelControl:
    """Every model this server may serve, its state, its loads and unloads, and the memory budget."""

    def __init__(
        self,
        table: ModelTable,
        scheduler: Scheduler,
        tokenizer: ThreadPoolExecutor,
        load_engine: LoadEngine,
        *,
        budget_bytes: int | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self.table = table
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.budget = ModelBudget(budget_bytes)
        self.loader = EngineLoader(load_engine, self.budget, self._return_memory)
        # Run once before the first load is measured: the runtime's one-time costs (importing the
        # engine's libraries) are nobody's model, and would otherwise be charged to the first one.
        self.prepare = prepare
        settings = table.settings
        self.settings = settings
        self.mode = settings.model_control_mode
        self.repository = ModelRepository(settings.model_repository) if settings.model_repository else None
        # The models named at start, by name: they can be unloaded and loaded again even when they
        # are not in the repository.
        self.started_configs: dict[str, ModelConfig] = {name: m.config for name, m in table.models.items()}
        self.catalog = ModelCatalog(self.repository, self.started_configs, table, allows_changes=self.allows_changes)
        # What the index says of every model, by name.
        self.records = self.catalog.records
        # Hands freed memory back: a thread of its own, so that no unload waits behind a load.
        self._trimmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maskserve-trim")
        self._loads: dict[str, asyncio.Task[None]] = {}
        # The settings each load in progress applies: a second load asking the same joins it.
        self._load_overrides: dict[str, dict[str, Any] | None] = {}
        self._unloads: dict[str, asyncio.Task[None]] = {}
        # When each serving model was loaded (monotonic), for on-demand pacing.
        self._loaded_at: dict[str, float] = {}

    @property
    def budget_bytes(self) -> int | None:
        return self.budget.budget_bytes

    @property
    def allows_changes(self) -> bool:
        """Whether the load and unload routes are on (explicit or on-demand control)."""
        return self.mode != "none"

    # -- what is known --------------------------------------------------------------------------

    def knows(self, name: str) -> bool:
        """A model this server could serve now: named at start, serving, or in the repository now."""
        return self.catalog.knows(name)

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model, by name, with its state and why (the repository index)."""
        return self.catalog.entries(ready_only, busy=self._busy())

    def models_state(self) -> ModelsState:
        """The figures the metrics export at scrape time."""
        return ModelsState(
            states={name: record.state for name, record in self.records.items()},
            memory_bytes=dict(self.budget.charged),
            budget_bytes=self.budget.budget_bytes,
        )

    def not_loaded(self, name: str) -> ModelNotLoaded:
        return self.catalog.not_loaded(name)

    def unknown(self, name: str) -> NotFound:
        return self.catalog.unknown(name, busy=self._busy())

    def _busy(self) -> list[str]:
        """Models loading or unloading: the index keeps them whatever their folder says now."""
        return [*self._loads, *self._unloads]

    # -- start-up -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every model named at start, in order, through the one load path. A model that cannot
        be served stops the start with the engine's error; models that do not fit the budget stop it
        with :class:`ModelsDoNotFit`, naming them."""
        budget = self.budget.budget_bytes
        configs = list(self.started_configs.values())
        if budget is not None:
            on_disk = {config.name: weights_bytes(config.source) for config in configs}
            if sum(on_disk.values()) > budget:
                raise ModelsDoNotFit.of(on_disk, budget)
        if self.prepare is not None:
            await self.loader.run("prepare", self.prepare)
        for config in configs:
            await self.load(config.name, reason="start", actor="start-up")

    # -- loading --------------------------------------------------------------------------------

    async def load_on_demand(self, name: str | None, deadline: float) -> None:
        """With on-demand control, load ``name`` (the default model for None) first when it is a
        known model not serving now, within ``deadline``. Every inference request asks this, on
        every protocol; nothing is looked up unless the mode is on-demand."""
        if self.mode != "on-demand":
            return
        wanted = self.table.default_name if name is None else name
        if wanted not in self.table.models and self.knows(wanted):
            await self.ensure(wanted, deadline)

    async def ensure(self, name: str, deadline: float) -> ServedModel:
        """The model ``name``, loading it first (on-demand control) within ``deadline``."""
        served = self.table.models.get(name)
        if served is not None:
            return served
        if self.mode != "on-demand" or not self.knows(name):
            raise self.not_loaded(name) if self.knows(name) else self.table.unknown(name)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(deadline - loop.time()):
                await self.load(name, reason="on_demand", actor="an inference request")
        except TimeoutError:
            raise DeadlineExceeded(
                f"model {name!r} is loading and was not ready within the request's deadline; it keeps loading"
            ) from None
        served = self.table.models.get(name)
        if served is None:  # unloaded again between its load and this request: rare, and retryable
            raise ModelUnavailable(f"model {name!r} was unloaded again before this request ran; retry it")
        return served

    async def load(
        self, name: str, overrides: dict[str, Any] | None = None, *, reason: str = "request", actor: str = ""
    ) -> None:
        """Load (or reload) ``name``; returns once it serves. Raises NotFound, ModelNotLoadable,
        ModelConfigInvalid, ModelLoadFailed, ModelsMemoryExceeded or LoadsPaced. The load goes on
        if the caller stops waiting."""
        if not self.knows(name):
            raise self.unknown(name)
        unloading = self._unloads.get(name)
        if unloading is not None:
            await asyncio.shield(unloading)
        while True:
            running = self._loads.get(name)
            if running is None:
                task = self._loads[name] = asyncio.create_task(self._load(name, overrides, reason, actor))
                self._load_overrides[name] = overrides
                task.add_done_callback(lambda _: self._loads.pop(name, None))
                break
            if reason == "on_demand" or self._load_overrides.get(name) == overrides:
                # The same load asked twice is one load; and a request that only needs the model
                # serving takes whatever load is under way rather than replacing its config.
                task = running
                break
            # Another configuration: this one applies after the load in progress, as a reload.
            await asyncio.shield(asyncio.gather(running, return_exceptions=True))
        await asyncio.shield(task)

    async def _load(self, name: str, overrides: dict[str, Any] | None, reason: str, actor: str) -> None:
        record = self.catalog.record(name)
        at_start = reason == "start"
        old = None if at_start else self.table.models.get(name)
        action = "reload" if old is not None else "load"
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + self.settings.model_load_timeout
        try:
            config = config_for_load(self.repository, self.started_configs, self.settings, name, overrides)
            check_files(self.repository, name)  # before anything is evicted for it
            estimate = self._estimate(name, config)
            await self._make_room(name, estimate, on_demand=reason == "on_demand", at_start=at_start)
            record.state, record.reason = ("READY", "reloading") if old else ("LOADING", "loading")
            engine, size = await self.loader.load(name, config, at_start, deadline)
            self.budget.reserved[name] = size
            if self.budget.over_by():
                await self._refit(name, size, estimate, at_start)
            served = self.table.models[name] if at_start else ServedModel(config)
            async with asyncio.timeout_at(deadline):
                await start_model(self.table, served, engine, self.scheduler, self.tokenizer)
            del engine
        except BaseException as exc:
            self.budget.reserved.pop(name, None)
            self._failed(record, exc, old, action, reason, actor)
            if at_start:
                stop = start_error(name, exc, self.settings.model_load_timeout)
                if stop is exc:
                    raise
                raise stop from exc
            if isinstance(exc, TimeoutError):
                raise ModelLoadFailed(failure_reason(name, exc, self.settings.model_load_timeout)) from None
            if not isinstance(exc, MaskserveError) and isinstance(exc, Exception):
                log.error("loading %r failed", name, exc_info=exc)
                raise ModelLoadFailed(f"loading {name!r} failed: {record.reason}") from exc
            raise
        # Reachable from here on: a reload swaps the warm model in at once, and the old one's
        # memory counts until its release ends.
        self.table.models[name] = served
        self._loaded_at[name] = time.monotonic()
        old_ticket = self.budget.releasing_from(self.budget.charged.get(name, 0)) if old is not None else None
        self.budget.charged[name] = self.budget.reserved.pop(name, size)
        record.state, record.reason, record.memory_bytes = "READY", "", size
        if not at_start:
            self.table.metrics.model_changes.labels(name, action, reason, "ok").inc()
        log.info(
            "model %s of %r by %s: ready in %.1fs, %d MiB resident",
            action,
            name,
            actor or reason,
            time.monotonic() - started,
            size // MIB,
        )
        if old is not None:
            await retire_model(self.table, old, self.scheduler)
            del old
        # What the load and warm-up made and dropped (and a reload's old model) goes back now.
        await self._return_memory()
        if old_ticket is not None:
            self.budget.released(old_ticket)

    def _failed(
        self, record: ModelRecord, exc: BaseException, old: ServedModel | None, action: str, reason: str, actor: str
    ) -> None:
        """Say in the index and the log why a load did not end serving."""
        why = failure_reason(record.name, exc, self.settings.model_load_timeout)
        result = "refused" if isinstance(exc, ModelsMemoryExceeded | LoadsPaced) else "failed"
        if old is not None:
            record.state, record.reason = "READY", f"reload {result}, the old model serves: {why}"
        else:
            record.state, record.reason = "UNAVAILABLE", f"load {result}: {why}"
        if reason != "start":
            self.table.metrics.model_changes.labels(record.name, action, reason, result).inc()
        log.warning("model %s of %r by %s: %s (%s)", action, record.name, actor or reason, result, why)

    def _estimate(self, name: str, config: ModelConfig) -> int:
        """Bytes a load of ``name`` will take: its last measured size, else its weights' on disk."""
        record = self.records.get(name)
        if record is not None and record.memory_bytes:
            return record.memory_bytes
        return weights_bytes(config.source)

    def _candidates(self) -> list[Candidate]:
        """The serving models, as a load may evict them."""
        return [
            Candidate(
                name,
                self.budget.charged.get(name, 0),
                served.last_used,
                self._loaded_at.get(name, 0.0),
                idle=self._idle(served),
            )
            for name, served in self.table.models.items()
        ]

    async def _make_room(self, name: str, need: int, *, on_demand: bool, at_start: bool) -> None:
        """Reserve ``need`` bytes for ``name``, evicting the least recently used idle models first
        when they do not fit; refuse (and evict nothing) when that would not do. At start nothing
        is evicted: every model named at start must fit."""
        pacing = self.settings.model_min_residency if on_demand and self.settings.model_min_residency else None
        candidates = [] if at_start else self._candidates()
        victims = self.budget.victims(name, need, candidates, now=time.monotonic(), min_residency=pacing)
        self.budget.reserved[name] = need
        for victim in victims:
            log.info("evicting %r (least recently used) to make room for %r", victim.name, name)
            await self.unload(victim.name, reason="eviction", actor=f"the load of {name!r}")

    async def _refit(self, name: str, size: int, estimate: int, at_start: bool) -> None:
        """The load measured more than it reserved and the models now pass the budget: evict idle
        models until they fit again, or refuse the new model (its engine is dropped)."""
        if at_start:
            raise ModelsDoNotFit.measured(name, size, self.budget)
        try:
            victims = self.budget.victims(name, 0, self._candidates(), now=time.monotonic(), min_residency=None)
        except ModelsMemoryExceeded:
            raise ModelsMemoryExceeded(
                f"model {name!r} measured {size // MIB} MiB at its load, more than the {estimate // MIB} MiB it was "
                "estimated at, and the budget (--models-memory) has no room for it even with every idle model "
                "unloaded: it was not kept"
            ) from None
        for victim in victims:
            log.info("evicting %r (least recently used): %r measured more than estimated", victim.name, name)
            await self.unload(victim.name, reason="eviction", actor=f"the load of {name!r}")

    def _idle(self, served: ServedModel) -> bool:
        parts = served.parts
        return not served.active and (parts is None or not parts.batcher.depth) and served.name not in self._loads

    # -- unloading ------------------------------------------------------------------------------

    async def unload(self, name: str, *, reason: str = "request", actor: str = "") -> None:
        """Take ``name`` out of service, answer what it accepted, release it; returns once released."""
        loading = self._loads.get(name)
        if loading is not None and reason != "eviction":
            # An unload asked during a load applies to what the load brings up.
            await asyncio.shield(asyncio.gather(loading, return_exceptions=True))
        task = self._unloads.get(name)
        if task is None:
            served = self.table.models.pop(name, None)
            if served is None:
                if not self.knows(name):
                    raise self.unknown(name)
                return  # not loaded: nothing to do, as the protocol answers
            record = self.catalog.record(name)
            record.state, record.reason = "UNLOADING", "unloading"
            self._loaded_at.pop(name, None)
            # Its memory counts until it is back with the system, not only until it leaves the table.
            ticket = self.budget.releasing_from(self.budget.charged.pop(name, 0))
            task = self._unloads[name] = asyncio.create_task(self._unload(served, ticket, reason, actor))
            task.add_done_callback(lambda _: self._unloads.pop(name, None))
        await asyncio.shield(task)

    async def _unload(self, served: ServedModel, ticket: int, reason: str, actor: str) -> None:
        record = self.records[served.name]
        try:
            await retire_model(self.table, served, self.scheduler)
            record.state = "UNAVAILABLE"
            record.reason = "evicted to make room (--models-memory)" if reason == "eviction" else "unloaded"
            self.table.metrics.model_changes.labels(served.name, "unload", reason, "ok").inc()
            log.info("model unload of %r by %s: released", served.name, actor or reason)
            del served
            await self._return_memory()
        finally:
            self.budget.released(ticket)

    async def _return_memory(self) -> None:
        """Free what a released model held: its cycles collected, the heap's free pages handed back
        (on the trimming thread: a trim of a large heap takes a while)."""
        gc.collect()
        with contextlib.suppress(RuntimeError):  # the trimming thread stopped: the server is leaving
            await asyncio.get_running_loop().run_in_executor(self._trimmer, release_freed_memory)

    async def close(self) -> None:
        """At shutdown: stop waiting for loads in progress (their models never serve)."""
        for task in list(self._loads.values()):
            task.cancel()
        self._trimmer.shutdown(wait=False, cancel_futures=True)
