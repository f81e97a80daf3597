"""Models loaded and unloaded while serving: the model repository extension's engine room.

One :class:`ModelControl` per server knows every model it may serve (those named at start, and
every model of ``--model-repository``), each in one of the protocol's states:

    UNAVAILABLE ──load──▶ LOADING ──ready──▶ READY ──unload──▶ UNLOADING ──released──▶ UNAVAILABLE
                              └──failed──▶ UNAVAILABLE (reason)     (a reload stays READY throughout)

**Loading never stalls serving.** The weights load (and any export or quantization) on a loader
thread of its own, never on the event loop or the inference thread; the warm-up passes then run on
the inference thread between other models' batches. A model becomes reachable only once warm, and
a reload swaps the new model in only then; if the new one fails, the old one keeps serving and
the reason says why. Two loads of one model are one load; a load waits for that model's unload.

**Unloading drains.** The model leaves the routes at once (404 naming it, or an on-demand load);
every request it had accepted is answered; then its lane, its series and its engine are released
and the heap's free pages handed back to the system.

**The memory budget** (``--models-memory``): each model's resident size is measured at its load.
A load that would pass the budget first unloads the least recently used idle models; when even
all of them would not make room it is refused, and nothing is unloaded for it.

No HTTP and no torch: the engine's loader is handed in by the app.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maskserve.config.model_configs import ModelConfig, with_overrides
from maskserve.config.model_repository import ModelRepository, NotInRepository
from maskserve.config.settings import NamedSettingsError
from maskserve.errors import (
    DeadlineExceeded,
    MaskserveError,
    ModelConfigInvalid,
    ModelLoadFailed,
    ModelNotLoadable,
    ModelNotLoaded,
    ModelsMemoryExceeded,
    NotFound,
)
from maskserve.model_api import FillMaskModel, describe_model
from maskserve.observability.metrics import ModelsState
from maskserve.service.model_parts import retire_model, start_model
from maskserve.service.registry import MODEL_VERSION, FillMaskService, ServedModel
from maskserve.serving.memory import release_freed_memory, resident_growth
from maskserve.serving.scheduler import Scheduler

log = logging.getLogger("maskserve.models")

# Loads the engine a configuration names (blocking: run on the loader thread). Raises
# ModelLoadFailed, with a reason fit for the index, for a model that cannot be served as asked.
LoadEngine = Callable[[ModelConfig], FillMaskModel]

# The files whose sizes estimate a model's memory before it is loaded for the first time.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt", ".pth", ".h5")
MIB = 1024 * 1024


@dataclass
class ModelRecord:
    """What the repository index says of one model."""

    name: str
    state: str = "UNAVAILABLE"
    reason: str = "not loaded"
    # Resident bytes the model took when it was last loaded (measured); None before its first load.
    memory_bytes: int | None = None


@dataclass(frozen=True)
class IndexEntry:
    """One model of the index, as the protocol lists it."""

    name: str
    version: str
    state: str
    reason: str
    memory_bytes: int | None


def weights_bytes(config: ModelConfig) -> int:
    """The size of a model's weight files in its folder; 0 when it has no folder here."""
    if config.source is None or not Path(config.source).is_dir():
        return 0
    return sum(p.stat().st_size for p in Path(config.source).iterdir() if p.suffix in WEIGHT_SUFFIXES)


class ModelControl:
    """Every model this server may serve, its state, its loads and unloads, and the memory budget."""

    def __init__(
        self,
        service: FillMaskService,
        scheduler: Scheduler,
        tokenizer: Executor,
        load_engine: LoadEngine,
        *,
        budget_bytes: int | None = None,
    ) -> None:
        self.service = service
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.load_engine = load_engine
        self.budget_bytes = budget_bytes
        settings = service.settings
        self.mode = settings.model_control_mode
        self.repository = ModelRepository(settings.model_repository) if settings.model_repository else None
        # The models named at start, by name: they can be unloaded and loaded again even when they
        # are not in the repository.
        self.started_configs: dict[str, ModelConfig] = {name: m.config for name, m in service.models.items()}
        self.records: dict[str, ModelRecord] = {}
        # One loader thread: a load never runs on the event loop nor on the inference thread, and
        # two loads never compete for the cores with each other as well as with serving.
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maskserve-loader")
        self._loads: dict[str, asyncio.Task[None]] = {}
        # The settings each load in progress applies: a second load asking the same joins it.
        self._load_overrides: dict[str, dict[str, Any] | None] = {}
        self._unloads: dict[str, asyncio.Task[None]] = {}
        # Bytes promised to loads in progress, so that two loads cannot both fit one free share.
        self._reserved: dict[str, int] = {}
        self.refresh()

    # -- what is known --------------------------------------------------------------------------

    @property
    def allows_changes(self) -> bool:
        """Whether the load and unload routes are on (explicit or on-demand control)."""
        return self.mode != "none"

    def refresh(self) -> None:
        """Know every model of the repository as it is now (a folder copied in while serving too)."""
        names = list(self.started_configs) + (self.repository.names() if self.repository else [])
        for name in names:
            self.records.setdefault(name, ModelRecord(name))
        for name in self.service.models:
            record = self.records.setdefault(name, ModelRecord(name))
            if record.state == "UNAVAILABLE":
                record.state, record.reason = "READY", ""

    def knows(self, name: str) -> bool:
        return name in self.records or (self.repository is not None and name in self.repository.names())

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model, by name, with its state and why (the repository index)."""
        self.refresh()
        return [
            IndexEntry(r.name, MODEL_VERSION, r.state, r.reason, r.memory_bytes)
            for r in sorted(self.records.values(), key=lambda r: r.name)
            if not ready_only or r.state == "READY"
        ]

    def models_state(self) -> ModelsState:
        """The figures the metrics export at scrape time."""
        return ModelsState(
            states={name: record.state for name, record in self.records.items()},
            memory_bytes={
                name: record.memory_bytes
                for name, record in self.records.items()
                if record.memory_bytes is not None and name in self.service.models
            },
            budget_bytes=self.budget_bytes,
        )

    def not_loaded(self, name: str) -> ModelNotLoaded:
        """The 404 for a known model that is not serving now, saying why and what would load it."""
        record = self.records.get(name) or ModelRecord(name)
        how = (
            f"load it with POST /v2/repository/models/{name}/load"
            if self.allows_changes
            else "this server's models are fixed at start (--model-control-mode none)"
        )
        return ModelNotLoaded(f"model {name!r} is not loaded ({record.state}: {record.reason}); {how}")

    def unknown(self, name: str) -> NotFound:
        """The 404 for a name that is no model of the repository's (nor named at start)."""
        self.refresh()
        held = ", ".join(repr(known) for known in sorted(self.records)) or "none"
        return NotFound(f"no model named {name!r} in the model repository; it holds {held}")

    def started(self, name: str, engine: FillMaskModel) -> None:
        """A model named at start is serving. Its size is its weights' on disk: what the process
        grows by during the first load of all is mostly the runtime's own one-time costs, which
        unloading the model would never give back."""
        record = self.records.setdefault(name, ModelRecord(name))
        source = describe_model(engine).get("source")
        config = self.started_configs[name]
        folder = source if isinstance(source, str) and config.source is None else config.source
        record.state, record.reason = "READY", ""
        record.memory_bytes = weights_bytes(ModelConfig(name, folder, config.settings))

    # -- loading --------------------------------------------------------------------------------

    async def load_on_demand(self, name: str | None, deadline: float) -> None:
        """With on-demand control, load ``name`` (the default model for None) first when it is a
        known model not serving now, within ``deadline``. Every inference request asks this, on
        every protocol; nothing is looked up unless the mode is on-demand."""
        if self.mode != "on-demand":
            return
        wanted = self.service.default_name if name is None else name
        if wanted not in self.service.models and self.knows(wanted):
            await self.ensure(wanted, deadline)

    async def ensure(self, name: str, deadline: float) -> ServedModel:
        """The model ``name``, loading it first (on-demand control) within ``deadline``."""
        served = self.service.models.get(name)
        if served is not None:
            return served
        if self.mode != "on-demand" or not self.knows(name):
            raise self.not_loaded(name) if self.knows(name) else self.service.unknown(name)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(deadline - loop.time()):
                await self.load(name, reason="on_demand", actor="an inference request")
        except TimeoutError:
            raise DeadlineExceeded(
                f"model {name!r} is loading and was not ready within the request's deadline; it keeps loading"
            ) from None
        served = self.service.models.get(name)
        if served is None:  # unloaded again between its load and this request: rare, and retryable
            raise self.not_loaded(name)
        return served

    async def load(
        self, name: str, overrides: dict[str, Any] | None = None, *, reason: str = "request", actor: str = ""
    ) -> None:
        """Load (or reload) ``name``; returns once it serves. Raises NotFound, ModelLoadFailed or
        ModelsMemoryExceeded. The load goes on if the caller stops waiting."""
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
            if self._load_overrides.get(name) == overrides:
                task = running  # the same load asked twice: one load
                break
            # Another configuration: this one applies after the load in progress, as a reload.
            await asyncio.shield(asyncio.gather(running, return_exceptions=True))
        await asyncio.shield(task)

    async def _load(self, name: str, overrides: dict[str, Any] | None, reason: str, actor: str) -> None:
        record = self.records.setdefault(name, ModelRecord(name))
        old = self.service.models.get(name)
        action = "reload" if old is not None else "load"
        started = time.monotonic()
        try:
            config = self._config(name, overrides)
            await self._make_room(name, self._estimate(name, config))
            record.state, record.reason = ("READY", "reloading") if old else ("LOADING", "loading")
            loop = asyncio.get_running_loop()
            engine, size = await loop.run_in_executor(self.loader, self._measured_load, config)
            self._reserved[name] = size
            served = ServedModel(config)
            await start_model(self.service, served, engine, self.scheduler, self.tokenizer)
        except BaseException as exc:
            self._reserved.pop(name, None)
            failed = exc if isinstance(exc, MaskserveError) else None
            why = failed.message if failed is not None else "an unexpected error; the server log has it"
            result = "refused" if isinstance(exc, ModelsMemoryExceeded) else "failed"
            if old is not None:
                record.state, record.reason = "READY", f"reload {result}, the old model serves: {why}"
            else:
                record.state, record.reason = "UNAVAILABLE", f"load {result}: {why}"
            self.service.metrics.model_changes.labels(name, action, reason, result).inc()
            log.warning("model %s of %r by %s: %s (%s)", action, name, actor or reason, result, why)
            if failed is None and isinstance(exc, Exception):
                log.error("loading %r failed", name, exc_info=exc)
                raise ModelLoadFailed(f"loading {name!r} failed: {why}") from exc
            raise
        # Reachable from here on: a reload swaps the warm model in at once.
        self.service.models[name] = served
        self._reserved.pop(name, None)
        record.state, record.reason, record.memory_bytes = "READY", "", size
        self.service.metrics.model_changes.labels(name, action, reason, "ok").inc()
        log.info(
            "model %s of %r by %s: ready in %.1fs, %d MiB resident",
            action,
            name,
            actor or reason,
            time.monotonic() - started,
            size // MIB,
        )
        if old is not None:
            await retire_model(self.service, old, self.scheduler)
        # What the load and warm-up made and dropped (and a reload's old model) goes back now.
        await self._return_memory()

    def _config(self, name: str, overrides: dict[str, Any] | None) -> ModelConfig:
        """The configuration a load of ``name`` applies: its folder's settings file is read afresh
        (a fault there is the folder's, 409), then the load's own overrides (a fault there is the
        client's, 400)."""
        settings = self.service.settings
        in_repository = self.repository is not None and name in self.repository.names()
        try:
            # A repository model's settings file is read afresh on every load, whether or not
            # the model was named at start.
            if in_repository:
                assert self.repository is not None
                try:
                    config = self.repository.config(name, settings)
                except NotInRepository as exc:
                    raise NotFound(str(exc)) from None
            else:
                config = self.started_configs[name]
        except NamedSettingsError as exc:
            raise ModelNotLoadable(str(exc)) from None
        if not overrides:
            return config
        try:
            if in_repository:
                assert self.repository is not None
                return self.repository.config(name, settings, overrides)
            return ModelConfig(name, config.source, with_overrides(config.settings, overrides, f"model {name!r}"))
        except NamedSettingsError as exc:
            raise ModelConfigInvalid(str(exc)) from None

    def _measured_load(self, config: ModelConfig) -> tuple[FillMaskModel, int]:
        """On the loader thread: the engine, and its size: the resident bytes its load added, or its
        weights' size on disk if larger (growth alone reads low when the load reuses memory the
        allocator still held from an earlier unload)."""
        engine, growth = resident_growth(functools.partial(self.load_engine, config))
        return engine, max(growth, weights_bytes(config))

    def _estimate(self, name: str, config: ModelConfig) -> int:
        """Bytes a load of ``name`` will take: its last measured size, else its weights' on disk."""
        record = self.records.get(name)
        if record is not None and record.memory_bytes:
            return record.memory_bytes
        return weights_bytes(config)

    async def _make_room(self, name: str, need: int) -> None:
        """Unload the least recently used idle models until ``need`` more bytes fit the budget; if
        even all of them would not do, refuse and unload nothing."""
        budget = self.budget_bytes
        if budget is None:
            return
        held = sum(self._held(other) for other in self.service.models) + sum(
            size for other, size in self._reserved.items() if other != name
        )
        if held + need <= budget:
            self._reserved[name] = need
            return
        idle = sorted(
            (served for other, served in self.service.models.items() if other != name and self._idle(served)),
            key=lambda served: served.last_used,
        )
        freeable = sum(self._held(served.name) for served in idle)
        if held - freeable + need > budget:
            raise ModelsMemoryExceeded(
                f"loading {name!r} needs about {need // MIB} MiB; the loaded models hold {held // MIB} MiB of the "
                f"{budget // MIB} MiB budget (--models-memory) and only {freeable // MIB} MiB of them are idle; "
                "nothing was unloaded"
            )
        self._reserved[name] = need
        for victim in idle:
            if held + need <= budget:
                break
            held -= self._held(victim.name)
            log.info("evicting %r (least recently used) to make room for %r", victim.name, name)
            await self.unload(victim.name, reason="eviction", actor=f"the load of {name!r}")

    def _held(self, name: str) -> int:
        record = self.records.get(name)
        return (record.memory_bytes or 0) if record is not None else 0

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
            served = self.service.models.pop(name, None)
            if served is None:
                if not self.knows(name):
                    raise self.unknown(name)
                return  # not loaded: nothing to do, as the protocol answers
            record = self.records.setdefault(name, ModelRecord(name))
            record.state, record.reason = "UNLOADING", "unloading"
            task = self._unloads[name] = asyncio.create_task(self._unload(served, reason, actor))
            task.add_done_callback(lambda _: self._unloads.pop(name, None))
        await asyncio.shield(task)

    async def _unload(self, served: ServedModel, reason: str, actor: str) -> None:
        record = self.records[served.name]
        await retire_model(self.service, served, self.scheduler)
        record.state = "UNAVAILABLE"
        record.reason = "evicted to make room (--models-memory)" if reason == "eviction" else "unloaded"
        self.service.metrics.model_changes.labels(served.name, "unload", reason, "ok").inc()
        log.info("model unload of %r by %s: released", served.name, actor or reason)
        await self._return_memory()

    async def _return_memory(self) -> None:
        """Free what the released model held: its cycles collected, the heap's free pages handed
        back (off the event loop: a trim of a large heap takes a while)."""
        gc.collect()
        await asyncio.get_running_loop().run_in_executor(self.loader, release_freed_memory)

    async def close(self) -> None:
        """At shutdown: stop waiting for loads in progress (their models never serve)."""
        for task in list(self._loads.values()):
            task.cancel()
        self.loader.shutdown(wait=False, cancel_futures=True)
