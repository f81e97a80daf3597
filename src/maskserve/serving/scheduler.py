"""The one inference thread, and which model's batch it runs next.

Every served model has its own :class:`~maskserve.serving.batcher.Batcher` (its queue, cost model and
admission); they share one :class:`Scheduler`, which owns the single-thread executor and the one
batch loop. Whatever the number of models, the thread runs one batch at a time, and a batch never
mixes models.

**Fairness by measured seconds.** Each model has an account of the seconds its batches have held
the thread. The next batch comes from the model with work waiting whose account is smallest, and
its pass's measured seconds are added to it. A model whose queue was empty joins at the account of
the model served last (never below its own), so it cannot save up credit while idle and then hold
the thread for a long run; a flooded model cannot starve a quiet one, which waits at most for the
pass in flight. This is fair queueing on the cost model's own unit (deficit round robin with a
vanishing quantum): no quantum to tune, and a model of long texts is charged for what its passes
really cost, not for how many texts it sends.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from maskserve.config.settings import Settings
from maskserve.serving.costs import Work
from maskserve.serving.forecast import Forecast


class Lane(Protocol):
    """One model's side, as the scheduler sees it (:class:`~maskserve.serving.batcher.Batcher` is one)."""

    settings: Settings

    @property
    def depth(self) -> int: ...

    @property
    def queued_work(self) -> Work: ...

    @property
    def forecast(self) -> Forecast: ...

    def predicted_wait(self, extra: Work = ...) -> float: ...

    def fail_pending(self, error: Exception) -> int: ...

    async def wait_for_company(self, loop: asyncio.AbstractEventLoop, alone: Callable[[], bool]) -> None: ...

    def next_batch(self, now: float) -> list[Any]: ...

    async def run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[Any]) -> float: ...


@dataclass
class InFlight:
    """The batch on the inference thread: whose, when it started and how long it should take."""

    lane: Lane
    started: float
    predicted_s: float


class Scheduler:
    """Owns the inference thread's executor and the batch loop; start :meth:`run` as one task."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.lanes: list[Lane] = []
        self.in_flight: InFlight | None = None
        self.batches_run = 0
        self.last_progress = time.monotonic()  # refreshed by the inference thread (heartbeat)
        self.closed = False
        self.arrived = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        # Seconds of the thread each lane's batches have held, and the lanes that had work at the
        # last pick (a lane that was idle then rejoins at the busy ones' smallest account).
        self._account: dict[int, float] = {}
        self._backlogged: set[int] = set()
        # The account of the lane picked last: the "now" of the accounts, where a lane that joins
        # starts (start-time fair queueing's virtual time).
        self._virtual = 0.0

    def add(self, lane: Lane) -> None:
        """A model loaded (at start or while serving): it joins at the accounts' "now", so it gets
        no credit for the time before it existed."""
        self.lanes.append(lane)
        self._account[id(lane)] = self._virtual

    def remove(self, lane: Lane) -> None:
        """A model unloaded, its queue empty and no batch of it in flight (the caller waits for both)."""
        self.lanes.remove(lane)
        self._account.pop(id(lane), None)
        self._backlogged.discard(id(lane))

    # -- what every lane reads -------------------------------------------------------------------

    @property
    def busy_for(self) -> float:
        """Seconds the batch in flight has held the inference thread; 0 when idle."""
        in_flight = self.in_flight
        return 0.0 if in_flight is None else time.monotonic() - in_flight.started

    def in_flight_remaining(self) -> float:
        """Predicted seconds until the batch in flight, whichever model's, is done."""
        in_flight = self.in_flight
        return 0.0 if in_flight is None else max(0.0, in_flight.predicted_s - self.busy_for)

    def predicted_wait(self, lane: Lane, own_s: float) -> float:
        """Seconds until ``own_s`` seconds of ``lane``'s work would be done, with the others sharing fairly.

        While it drains, each other model with work gets at most as much of the thread as it does
        (the accounts stay level), so each adds the smaller of its own queued work and ``own_s``.
        """
        others = sum(
            min(other.forecast.seconds_for(other.queued_work), own_s)
            for other in self.lanes
            if other is not lane and other.depth
        )
        return self.in_flight_remaining() + own_s + others

    def stall_budget(self, floor: float) -> float:
        """Seconds one batch may hold the thread before it counts as stuck: the largest of any model's."""
        return max((lane.forecast.stall_budget(floor) for lane in self.lanes), default=floor)

    @property
    def depth(self) -> int:
        return sum(lane.depth for lane in self.lanes)

    # -- intake and shutdown (event loop) ---------------------------------------------------------

    def wake(self) -> None:
        """A lane queued work: the loop looks again."""
        self.idle.clear()
        self.arrived.set()

    def close(self) -> None:
        """Stop intake on every lane: admission refuses every later request as shutting down."""
        self.closed = True
        self.arrived.set()

    async def drain(self, budget: float) -> bool:
        """After :meth:`close`, wait up to ``budget`` seconds for every queue and the batch in flight."""
        try:
            async with asyncio.timeout(budget):
                await self.idle.wait()
        except TimeoutError:
            return False
        return True

    # -- the batch loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Form and run batches until cancelled. Never waits when there is anything to run."""
        loop = asyncio.get_running_loop()
        while True:
            waiting = [lane for lane in self.lanes if lane.depth]
            if not waiting:
                self.idle.set()
                self.arrived.clear()
                await self.arrived.wait()
                continue
            await self._run_next(loop, waiting)

    async def _run_next(self, loop: asyncio.AbstractEventLoop, waiting: Sequence[Lane]) -> None:
        """One batch of the lane picked next. Its own frame, so the loop keeps no reference to the
        lane it ran last: an unloaded model's memory must not wait for the next batch to go."""
        lane = self.pick(waiting)
        if len(waiting) == 1:
            # A batch window only while no other model has work: the thread never idles
            # for one model's company while another's texts wait.
            await lane.wait_for_company(loop, alone=functools.partial(self.only_one_waiting, lane))
        batch = lane.next_batch(loop.time())
        if batch:
            seconds = await lane.run_batch(loop, batch)
            # A lane removed while its batch ran (its model unloaded) has no account any more.
            if id(lane) in self._account:
                self._account[id(lane)] += seconds

    def only_one_waiting(self, lane: Lane) -> bool:
        """Whether ``lane`` is the only one with texts waiting."""
        return self.depth == lane.depth

    def pick(self, waiting: Sequence[Lane]) -> Lane:
        """The lane whose batch runs next: the smallest account among those with work (module docstring)."""
        keys = {id(lane) for lane in waiting}
        for key in keys - self._backlogged:  # joined since the last pick: no credit saved while idle
            self._account[key] = max(self._account[key], self._virtual)
        self._backlogged = keys
        chosen = min(waiting, key=lambda lane: self._account[id(lane)])
        self._virtual = self._account[id(chosen)]
        return chosen
