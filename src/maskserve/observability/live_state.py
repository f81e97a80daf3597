"""The figures read when /metrics is scraped, not counted as they happen: each model's queue,
drops and refusals, the models by state with their memory, the readiness verdict and the client
connections, each read from its owner (the batcher, admission, the model repository, the connection
guard), so that they can never drift from its own counters.

:class:`~maskserve.observability.metrics.Metrics` registers these collectors on its registry and
hands them the parts to read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from maskserve.serving.admission import Admission
from maskserve.serving.batcher import Batcher
from maskserve.serving.connection_guard import CLOSE_REASONS, ConnectionGuard
from maskserve.serving.costs import ONE_TEXT

# Every refusal reason admission counts, exported at 0 before the first one happens, so that
# rate() and alerts see the series from the start.
REFUSAL_REASONS = ("queue_full", "predicted_timeout", "shutting_down")


@dataclass(frozen=True)
class Lane:
    """One model's live parts, read at scrape time."""

    name: str
    batcher: Batcher
    admission: Admission | None
    load_seconds: float | None


class ServingState(Collector):
    """Figures read from the batchers and admissions when scraped, so they never drift from them."""

    def __init__(self) -> None:
        self.lanes: list[Lane] = []
        self.ready: Callable[[], bool] | None = None
        self.models: Callable[[], ModelsState] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.models is not None:
            yield from _models_families(self.models())
        lanes = self.lanes
        if not lanes:  # the models are not loaded yet
            return
        if self.ready is not None:
            yield GaugeMetricFamily(
                "maskserve_ready",
                "1 while /readyz answers 200 (loaded, not draining, not stuck), else 0; never load.",
                value=1.0 if self.ready() else 0.0,
            )
        depth = GaugeMetricFamily("maskserve_queue_depth", "Texts waiting for each model now.", labels=["model"])
        limit = GaugeMetricFamily(
            "maskserve_queue_limit", "Most texts that may wait for each model (--max-queue).", labels=["model"]
        )
        wait = GaugeMetricFamily(
            "maskserve_predicted_wait_seconds",
            "Predicted wait for one more text of each model now, from the measured cost and the other "
            "models' fair share; admission refuses at the door by it.",
            labels=["model"],
        )
        dropped = CounterMetricFamily(
            "maskserve_dropped_texts",
            "Texts removed from a model's queue without a forward pass: deadline passed or sure to pass "
            "(expired), or client gone (abandoned).",
            labels=["model", "reason"],
        )
        refused = CounterMetricFamily(
            "maskserve_refused_requests",
            "Requests admission refused with 503, at the door or once parsed, by model and reason.",
            labels=["model", "reason"],
        )
        load = GaugeMetricFamily(
            "maskserve_model_load_seconds", "Seconds each model took to load at start-up.", labels=["model"]
        )
        for lane in lanes:
            batcher = lane.batcher
            depth.add_metric([lane.name], batcher.depth)
            limit.add_metric([lane.name], batcher.settings.max_queue)
            wait.add_metric([lane.name], batcher.predicted_wait(ONE_TEXT))
            dropped.add_metric([lane.name, "expired"], batcher.drops.expired)
            dropped.add_metric([lane.name, "abandoned"], batcher.drops.abandoned)
            if lane.admission is not None:
                counts = lane.admission.refused
                for reason in sorted(set(REFUSAL_REASONS) | set(counts)):
                    refused.add_metric([lane.name, reason], counts[reason])
            if lane.load_seconds is not None:
                load.add_metric([lane.name], lane.load_seconds)
        # One thread for every model: its pass in flight is the server's.
        yield GaugeMetricFamily(
            "maskserve_inference_in_flight_seconds",
            "How long the forward pass in flight (any model's) has been running; 0 when idle (/livez "
            "compares it with the stall budget).",
            value=lanes[0].batcher.scheduler.busy_for,
        )
        for family in (depth, limit, wait, dropped, refused, load):
            if family.samples:
                yield family


@dataclass(frozen=True)
class ModelsState:
    """The model repository's figures at one moment."""

    states: dict[str, str]  # model name: READY, LOADING, UNLOADING or UNAVAILABLE
    memory_bytes: dict[str, int]  # each loaded model's resident size, measured at its load
    budget_bytes: int | None  # --models-memory, resolved; None without a budget


# Every state a repository model can be in, each exported (at 0 when no model is in it).
MODEL_STATES = ("READY", "LOADING", "UNLOADING", "UNAVAILABLE")


def _models_families(state: ModelsState) -> Iterator[Metric]:
    by_state = GaugeMetricFamily(
        "maskserve_models", "Models of the repository (and those named at start) by state.", labels=["state"]
    )
    for name in MODEL_STATES:
        by_state.add_metric([name], sum(1 for held in state.states.values() if held == name))
    yield by_state
    memory = GaugeMetricFamily(
        "maskserve_model_memory_bytes",
        "Resident memory each loaded model took, measured at its load (what --models-memory counts).",
        labels=["model"],
    )
    for model, size in sorted(state.memory_bytes.items()):
        memory.add_metric([model], size)
    yield memory
    if state.budget_bytes is not None:
        yield GaugeMetricFamily(
            "maskserve_models_memory_budget_bytes",
            "The most resident memory the loaded models may hold together (--models-memory).",
            value=state.budget_bytes,
        )


class ConnectionState(Collector):
    """The client connections, read from the connection guard when scraped."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        guard = self.guard
        yield GaugeMetricFamily(
            "maskserve_open_connections", "Client connections open now (--max-connections).", value=len(guard.open)
        )
        yield GaugeMetricFamily(
            "maskserve_unsent_bytes",
            "Bytes of answers written but not yet taken by their clients (--max-unsent-bytes).",
            value=guard.unsent_bytes(),
        )
        closed = CounterMetricFamily(
            "maskserve_closed_connections",
            "Connections the server closed, by reason: header_timeout, body_timeout, write_timeout, "
            "unsent_bytes (the slowest readers, past --max-unsent-bytes), idle (keep-alive), "
            "connection_limit (refused past --max-connections).",
            labels=["reason"],
        )
        for reason in sorted(set(CLOSE_REASONS) | set(guard.closed)):
            closed.add_metric([reason], guard.closed[reason])
        yield closed
