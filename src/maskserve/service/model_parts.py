"""A loaded engine becomes a served model, and a served model goes away: the two steps every model
takes, at start-up and while serving (the model repository's loads and unloads).

Starting builds the model's batcher (its lane on the one inference thread), warms it up on that
thread, gives it admission and exports its metrics; only then may a route resolve it. Retiring is
the reverse, once no route resolves it any more: the requests it had accepted are answered, then
its lane, its series and every reference to its engine go, so that its memory can be returned.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from maskserve.model_api import FillMaskModel
from maskserve.service.served_model import ModelParts, ModelTable, ServedModel
from maskserve.serving.admission import Admission
from maskserve.serving.batcher import Batcher
from maskserve.serving.scheduler import Scheduler

log = logging.getLogger("maskserve")


async def start_model(
    table: ModelTable, served: ServedModel, engine: FillMaskModel, scheduler: Scheduler, tokenizer: Executor
) -> ModelParts:
    """``engine`` as ``served``'s parts: its lane, warmed up (when the settings say so), admitted
    and observed. The caller then makes it reachable (``table.models``)."""
    batcher = Batcher(engine, scheduler.executor, served.settings, scheduler=scheduler, name=served.name)
    if served.settings.warmup:
        # Before any request can reach it: its passes are no one's, and admission starts from
        # measured costs. On the inference thread, between other models' batches.
        try:
            seconds = await batcher.warm_up(served.settings.max_top_k)
        except BaseException:
            scheduler.remove(batcher)  # a model that never served leaves no lane behind
            raise
        log.info(
            "%s warmed up in %.2fs: the longest batch its limits admit would take about %.1fs here; stall budget %.1fs",
            served.name,
            seconds,
            batcher.forecast.calibrated_longest_s,
            batcher.forecast.stall_budget(served.settings.stall_timeout),
        )
    parts = served.parts = ModelParts(engine, batcher, Admission(batcher), tokenizer)
    table.metrics.attach(batcher, parts.admission, served.name)
    for listener in table.listeners:
        listener(served)
    return parts


async def retire_model(table: ModelTable, served: ServedModel, scheduler: Scheduler) -> None:
    """Once ``served`` is out of ``table.models``: answer what it accepted, then release it."""
    parts = served.parts
    if parts is None:
        return
    # Every request that resolved it before it left is answered: each counts from its parse to its
    # answer, and its rows are queued within that span. Released with no await after the last
    # check, so no request can slip in between. Its passes let go of its engine before their
    # answers reach the loop (serving/inference.py's OnePass): nothing here waits for the
    # inference thread, so an unload never waits behind another model's pass or warm-up.
    while True:
        await served.quiet.wait()
        in_flight = scheduler.in_flight
        if not parts.batcher.depth and (in_flight is None or in_flight.lane is not parts.batcher):
            break
        await asyncio.sleep(0.01)
    served.released = True
    scheduler.remove(parts.batcher)
    # Its series go with it, unless a reload's model of the same name carries them on.
    table.metrics.detach(parts.batcher, served.name, series=table.models.get(served.name) is None)
    served.parts = None
    parts.batcher.listeners.clear()
